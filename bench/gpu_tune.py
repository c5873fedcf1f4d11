"""Kernel-level A/B timings on one GPU, for the choices bench/gpu.py's full run cannot vary cheaply.

1. Prefill sparse attention at a 127K position, one kernel launch per variant. The shape of
one layer of a 4096-token prefill chunk of bench/gpu.py's 8B-shaped model at 131072 - 4096: q [4080, 32, 128] (the chunk less its routed tail), K/V [131072, 8, 128] bf16,
eight routing chunks of 512 queries with 16 routed blocks each per kv head, window 1024,
4 sinks, blocks of 64 (engine/settings.py). Times the one-list kernel (`PREFILL_LOOPS=False`)
against the three-loop prefill kernel under several launch configurations, checks every
variant's output against the one-list kernel's, and prints TFLOP/s counted on the keys each
query really attends to (sinks + window + 16 x 64 routed).
2. The prefill chunk's projections at 4096 and 8192 rows (is a longer chunk worth it?).

Whole-model A/B of the same choices: `bench/gpu.py --variants`.

    python3 bench/gpu_tune.py [--reps 30]
"""

from __future__ import annotations

import argparse

import torch
import triton

if __package__ in (None, ""):
    from gpu_path import import_checkout

    import_checkout()

from docqa.kernels.attention import triton_sparse
from docqa.kernels.attention.triton_sparse import fused_sparse_attention


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=131072)
    args = ap.parse_args()
    torch.manual_seed(0)
    t, hq, hkv, d, blk, sinks, window, top_k, rc = 4080, 32, 8, 128, 64, 4, 1024, 16, 512
    n = args.context
    p0 = n - 4096
    q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16)
    n_c = -(-t // rc)
    cand = (p0 - window) // blk  # blocks before every chunk's window
    idx = torch.stack([torch.stack([torch.randperm(cand - 1)[:top_k] + 1 for _ in range(hkv)])
                       for _ in range(n_c)]).to("cuda")
    out = torch.empty_like(q)
    run = lambda: fused_sparse_attention(q, k, v, p0, idx, blk, sinks, window, route_chunk=rc, out=out)
    keys = sinks + window + top_k * blk
    flops = 4 * t * hq * d * keys

    triton_sparse.PREFILL_LOOPS = False
    ms = timed(run, args.reps)
    ref = out.clone()
    print(f"one-list kernel: {ms:.3f} ms  {flops / ms / 1e9:.0f} TFLOP/s  (x32 layers: {32 * ms:.1f} ms per chunk)")
    triton_sparse.PREFILL_LOOPS = True
    best = None
    for bm, warps, stages in [(128, 8, 2), (128, 8, 3), (128, 8, 4), (64, 4, 2), (64, 4, 3)]:
        triton_sparse.PREFILL_BLOCK_M = bm
        triton_sparse.PREFILL_LAUNCH = {"num_warps": warps, "num_stages": stages}
        name = f"three loops, rows {bm}, warps {warps}, stages {stages}"
        try:
            out.fill_(float("nan"))
            ms = timed(run, args.reps)
        except triton.runtime.errors.OutOfResources as e:  # a configuration too big for shared memory
            print(f"{name}: failed ({type(e).__name__}: {str(e)[:80]})")
            continue
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        ok = err < 1e-2
        print(f"{name}: {ms:.3f} ms  {flops / ms / 1e9:.0f} TFLOP/s  rel.err vs one-list {err:.1e}"
              f"{'' if ok else '  WRONG'}", flush=True)
        if ok and (best is None or ms < best[0]):
            best = (ms, bm, warps, stages)
    if best:
        print(f"best: rows {best[1]}, warps {best[2]}, stages {best[3]}: {best[0]:.3f} ms")
    gemm_rates()


def gemm_rates() -> None:
    """The prefill chunk's four projections (8B shape) at 4096 and 8192 rows: is a longer
    chunk worth it for the matrix units?"""
    h, q, kv, ffn = 4096, 4096, 1024, 14336
    shapes = [(h, q + 2 * kv), (q, h), (h, 2 * ffn), (ffn, h)]  # (in, out): qkv, o, gate_up, down
    for m in (4096, 8192):
        total_ms, total_flop = 0.0, 0
        for k_in, n_out in shapes:
            a = torch.randn(m, k_in, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n_out, k_in, device="cuda", dtype=torch.bfloat16)
            total_ms += timed(lambda a=a, w=w: a @ w.t(), 20)
            total_flop += 2 * m * k_in * n_out
        print(f"projections at {m} rows: {total_ms / m * 1e3:.2f} us per token, {total_flop / total_ms / 1e9:.0f} TFLOP/s")




if __name__ == "__main__":
    main()
