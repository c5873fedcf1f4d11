"""GPU benchmark: a Llama-3-8B-shaped model (random bf16 weights) on one GPU, sparse vs dense.

Run from the repository root on a CUDA machine (the package need not be installed):

    PYTHONUNBUFFERED=1 python3 bench/gpu.py [--quick] [--skip-dense-128k] [--json FILE]

Prints, in one run: correctness checks of the Triton kernels against the PyTorch references
on the GPU, the machine's copy bandwidth and matrix rate, decode ms/token at 32K / 128K / 1M,
prefill seconds at 32K / 128K / 1M (1M with `--prefill-1m`; bf16 KV tiered between the GPU
and pinned CPU memory, since it does not fit beside the weights), first-token latency of a
64-token question over a cached 128K and 1M document, peak memory, and the dense SDPA figures
with ratios. `--quick` shrinks the model to 4 layers and the
contexts 8x, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import traceback

import torch

if __package__ in (None, ""):  # run as a script from a checkout
    from gpu_path import import_checkout

    import_checkout()

from docqa.engine.gpu.model import (
    GEMV_ALL,
    GEMV_DEFAULT,
    LLAMA3_8B,
    GraphedDecode,
    KVCache,
    Model,
    Routing,
    Shape,
    Weights,
)
from docqa.engine.gpu.tiering import SegmentTiers, TieredKVCache

RESULTS: dict = {}
PROFILE = PREFILL_1M = VARIANTS = False
RESERVE_GIB = 5.0  # GPU memory the tiered 1M run leaves free for activations, graphs, workspaces
GPU_KV_GIB: float | None = None  # cap on the tiered run's GPU KV pool (default: all that fits)
TARGETS = {"decode_128k_ms": 5.0, "decode_1m_ms": 7.0, "prefill_128k_s": 3.5, "prefill_1m_s": 40.0,
           "first_token_1m_s": 0.5}


def say(*a):
    print(*a, flush=True)


def rel(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN"
    return ((a - b).norm() / b.norm()).item()


def timed(fn, reps: int) -> float:
    """Median ms of fn over reps, CUDA events around each call."""
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def stage(name):
    def wrap(fn):
        def run(*a, **k):
            say(f"\n== {name}")
            t0 = time.time()
            try:
                return fn(*a, **k)
            except Exception:
                traceback.print_exc()
                RESULTS.setdefault("errors", []).append(name)
            finally:
                say(f"   ({time.time() - t0:.1f} s wall)")
        return run
    return wrap


@stage("machine ceilings")
def ceilings():
    x = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), 10)
    tbps = 2 * x.numel() * 2 / (ms * 1e-3) / 1e12
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms_mm = timed(lambda: a @ a, 10)
    tf = 2 * 8192**3 / (ms_mm * 1e-3) / 1e12
    RESULTS["copy_TBps"], RESULTS["matmul_TFLOPs"] = tbps, tf
    say(f"   device-to-device copy {tbps:.2f} TB/s (read+write); bf16 8192^3 matmul {tf:.0f} TFLOP/s")


@stage("programmatic dependent launch for the GEMVs")
def pdl_check():
    """Turn GEMV_PDL off (and say so) if this Triton / driver cannot launch the GEMVs with PDL."""
    from docqa.kernels.linear import fused_gemv, naive_gemv, triton_gemv

    if not triton_gemv.GEMV_PDL:
        say("   off (this Triton has no grid-dependency ops)")
        return
    try:
        x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16) / 64
        e = rel(fused_gemv(fused_gemv(x, w[:4096]), w), naive_gemv(naive_gemv(x, w[:4096]), w))
        assert e < 2e-2, e
        say(f"   on (two chained PDL GEMVs: rel err {e:.1e})")
    except Exception as exc:
        triton_gemv.GEMV_PDL = False
        say(f"   OFF: {type(exc).__name__}: {str(exc)[:200]}")
    RESULTS["gemv_pdl"] = triton_gemv.GEMV_PDL


@stage("correctness: Triton vs PyTorch references on the GPU (bf16)")
def correctness():
    from docqa.kernels.attention.naive import (
        naive_attention,
        naive_block_descriptors,
        naive_block_scores,
        naive_sparse_attention,
        naive_topk_blocks,
    )
    from docqa.kernels.attention.triton_sparse import (
        fused_attention,
        fused_block_scores,
        fused_sparse_attention,
        fused_topk_blocks,
    )
    from docqa.kernels.norm import fused_rms_norm, naive_rms_norm
    from docqa.kernels.rope import fused_rope, naive_rope, rope_cos_sin
    from docqa.kernels.swiglu import fused_swiglu, naive_swiglu

    bf = torch.bfloat16
    checks = {}
    x = torch.randn(4099, 4096, device="cuda", dtype=bf)
    w = torch.randn(4096, device="cuda", dtype=bf)
    checks["rms_norm"] = rel(fused_rms_norm(x, w), naive_rms_norm(x, w))
    qk = torch.randn(4099, 40, 128, device="cuda", dtype=bf)
    cos, sin = rope_cos_sin(torch.arange(4099, device="cuda") * 97, 128)
    checks["rope"] = rel(fused_rope(qk, cos, sin), naive_rope(qk, cos, sin))
    gu = torch.randn(4099, 2 * 14336, device="cuda", dtype=bf)
    checks["swiglu"] = rel(fused_swiglu(gu[:, :14336], gu[:, 14336:]), naive_swiglu(gu[:, :14336], gu[:, 14336:]))

    n, hkv, hq, d, bs = 32768, 8, 32, 128, 64
    k = torch.randn(n, hkv, d, device="cuda", dtype=bf)
    v = torch.randn(n, hkv, d, device="cuda", dtype=bf)
    kmin, kmax, kmean = naive_block_descriptors(k, bs)
    for t in (1, 512):
        q = torch.randn(t, hq, d, device="cuda", dtype=bf)
        for method in ("minmax", "mean"):
            checks[f"block_scores_{method}_T{t}"] = rel(fused_block_scores(q, kmin, kmax, kmean, method),
                                                        naive_block_scores(q, kmin, kmax, kmean, method))
        scores = naive_block_scores(q, kmin, kmax, kmean)
        end = (n - t - 1024 + bs) // bs
        ref_idx = naive_topk_blocks(scores, 16, 0, end)
        idx = fused_topk_blocks(scores, 16, 0, end)
        checks[f"topk_equal_T{t}"] = float(not torch.equal(idx, ref_idx))
        ro, rl = naive_sparse_attention(q, k, v, n - t, idx, bs, 4, 1024)
        o, lse = fused_sparse_attention(q, k, v, n - t, idx, bs, 4, 1024)
        checks[f"sparse_attn_T{t}"] = rel(o, ro)
        checks[f"sparse_lse_T{t}"] = rel(lse, rl)
    q = torch.randn(1, hq, d, device="cuda", dtype=bf)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    ro, _ = naive_sparse_attention(q, k8.to(bf), v8.to(bf), n - 1, idx[:, :16] if idx.dim() == 2 else idx, bs, 4, 1024)
    o, _ = fused_sparse_attention(q, k8, v8, n - 1, idx, bs, 4, 1024)
    checks["sparse_attn_fp8kv_T1"] = rel(o, ro)
    # a 4096-query prefill chunk (the 128-row tiles) with one selection per 512-query routing chunk
    qc = torch.randn(4096, hq, d, device="cuda", dtype=bf)
    kc, vc = k[:8192], v[:8192]
    cmin, cmax, cmean = naive_block_descriptors(kc, bs)
    sc = fused_block_scores(qc, cmin, cmax, cmean, "minmax", chunk=512)
    checks["block_scores_chunked_T4096"] = max(
        rel(sc[c], naive_block_scores(qc[c * 512:(c + 1) * 512], cmin, cmax, cmean)) for c in range(8))
    cidx = fused_topk_blocks(sc, 16, 0, 40)
    o, _ = fused_sparse_attention(qc, kc, vc, 4096, cidx, bs, 4, 1024)
    checks["sparse_attn_T4096_routing_chunks"] = max(
        rel(o[c * 512:(c + 1) * 512], naive_sparse_attention(qc[c * 512:(c + 1) * 512], kc, vc, 4096 + c * 512,
                                                             cidx[c], bs, 4, 1024)[0]) for c in range(8))
    qd = torch.randn(256, hq, d, device="cuda", dtype=bf)
    ro, rl = naive_attention(qd, k[:4096], v[:4096], 4096 - 256)
    o, lse = fused_attention(qd, k[:4096], v[:4096], 4096 - 256)
    checks["dense_attn_T256"] = rel(o, ro)
    # every block selected: sparse must equal dense
    nb = 4096 // bs
    all_idx = torch.arange(nb, device="cuda")[None].expand(hkv, nb).contiguous()
    o2, _ = fused_sparse_attention(qd, k[:4096], v[:4096], 4096 - 256, all_idx, bs, 4, 1024)
    checks["sparse_full_budget_vs_dense"] = rel(o2, ro)
    from docqa.kernels.linear import fused_gemv, naive_gemv
    xr = torch.randn(1, 4096, device="cuda", dtype=bf)
    g1 = 1 + 0.1 * torch.randn(4096, device="cuda", dtype=bf)
    for name, wshape, kw in (("qkv+norm", (6144, 4096), {"norm_weight": g1, "eps": 1e-5}),
                             ("w13+norm+swiglu", (2 * 14336, 4096), {"norm_weight": g1, "eps": 1e-5, "swiglu": True}),
                             ("w2+residual", (4096, 14336), {"residual": xr})):
        wm = torch.randn(wshape, device="cuda", dtype=bf) / wshape[1] ** 0.5
        xin = torch.randn(1, wshape[1], device="cuda", dtype=bf)
        checks[f"gemv_{name}"] = rel(fused_gemv(xin, wm, **kw), naive_gemv(xin, wm, **kw))
    bad = {name: e for name, e in checks.items() if not e < 2e-2}
    for name, e in checks.items():
        say(f"   {name:32s} rel err {e:.2e}")
    say("   ALL OK" if not bad else f"   FAILED: {bad}")
    RESULTS["correctness"] = {"max_rel_err": max(checks.values()), "failed": sorted(bad)}


def decode_ms(model, kv, n, mode="sparse", reps=30):
    g = GraphedDecode(model, kv, n, mode)
    ms = timed(g.replay, reps)  # sparse: each replay is the next token, context n .. n+reps
    del g
    return ms


def first_token_s(model, kv, n, reps=5):
    q = torch.randint(0, model.s.vocab, (64,), device="cuda")
    return timed(lambda: model.prefill(q, kv, n).argmax(-1), reps) / 1e3


@stage("sparse, bf16 KV: prefill 128K (32K = its first quarter), decode and first token at 32K / 128K")
def sparse_bf16(model, n_long, n_short):
    kv = KVCache(model.s, n_long + 256)
    toks = torch.randint(0, model.s.vocab, (n_long,), device="cuda")
    model.prefill(toks[:8192], kv)  # compile/warm every kernel shape
    from docqa.kernels.attention.triton_sparse import fused_decode_topk
    # the routing top-k's kernel shapes deeper in the document (one compile per power of two of
    # the block count, which the timed prefill below would otherwise pay as it grows)
    for nb in (256, 512, 1024, 2048, 4096, 8192, 16384):
        fused_decode_topk(torch.randn(8, nb, device="cuda"), model.r.top_k)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    chunks = []
    t0 = time.time()
    model.prefill(toks, kv, chunk_times=chunks)
    torch.cuda.synchronize()
    total = time.time() - t0
    times = [(p0, ev[0].elapsed_time(ev[1]) / 1e3) for p0, _, ev in chunks]
    short = sum(t for p0, t in times if p0 < n_short)
    RESULTS["chunk_times_bf16"] = times
    RESULTS["prefill_long_s"], RESULTS["prefill_short_s"] = total, short
    RESULTS["peak_prefill_long_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    say(f"   prefill {n_long}: {total:.2f} s ({n_long / total:,.0f} tok/s); first {n_short}: {short:.2f} s; "
        f"peak {RESULTS['peak_prefill_long_GiB']:.1f} GiB")
    for n, key in ((n_short, "short"), (n_long, "long")):
        torch.cuda.reset_peak_memory_stats()
        ms = decode_ms(model, kv, n)
        RESULTS[f"decode_{key}_ms"] = ms
        say(f"   decode @ {n}: {ms:.2f} ms/token (CUDA graph, sparse: sinks 4 + top-16 x 64 + window 1024; "
            f"fused GEMV for {', '.join(model.gemv) or 'none'}, cuBLAS for the rest)")
        chosen = model.gemv
        for variant in (GEMV_ALL, ()):  # the same graph with the other projection paths
            if variant == chosen:
                continue
            model.gemv = variant
            RESULTS[f"decode_{key}_ms_gemv_{'+'.join(variant) or 'none'}"] = other = decode_ms(model, kv, n)
            say(f"      same with fused GEMV for {', '.join(variant) or 'none (all cuBLAS)'}: {other:.2f} ms/token")
        model.gemv = chosen
    if VARIANTS:
        variants_decode(model, kv, n_long)
        variants_prefill(model, kv, n_long - 4096, "128k")
    if PROFILE:
        profile_decode(model, kv, n_long)
        profile_prefill_chunk(model, kv, n_long - 4096)
    RESULTS["first_token_long_s"] = ft = first_token_s(model, kv, n_long)
    RESULTS["peak_decode_long_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    say(f"   first token, 64-token question on cached {n_long}: {ft * 1e3:.1f} ms; peak {RESULTS['peak_decode_long_GiB']:.1f} GiB")
    del kv


class knobs:
    """Set module-level kernel knobs for a with-block, restoring them after."""

    def __init__(self, **kw):
        from docqa.kernels.attention import triton_sparse
        from docqa.kernels.linear import triton_gemv
        self.mods = {"FAST_WHOLE_TILES": triton_sparse, "MAX_SPLITS": triton_sparse, "DECODE_PROGRAMS": triton_sparse,
                     "TOPK_TILE_MIN": triton_sparse, "SCORE_TILE": triton_sparse, "NORM_EPILOGUE": triton_gemv,
                     "GEMV_PDL": triton_gemv, "ROUTING_PDL": triton_sparse, "PREFILL_LOOPS": triton_sparse}
        self.kw, self.old = kw, {}

    def __enter__(self):
        for k, v in self.kw.items():
            self.old[k] = getattr(self.mods[k], k)
            setattr(self.mods[k], k, v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(self.mods[k], k, v)


# each change undone alone, then all at once (the 2026-11-30 kernels)
DECODE_VARIANTS = {
    "routing kernels without dependent launch (s5)": {"ROUTING_PDL": False},
    "GEMVs without programmatic dependent launch (s4)": {"GEMV_PDL": False},
    "gemv norm as a prologue pass (old)": {"NORM_EPILOGUE": False},
    "top-k first-pass tiles of 1024 (old)": {"TOPK_TILE_MIN": 1024},
    "split-KV 16 programs per head (old)": {"MAX_SPLITS": 16, "DECODE_PROGRAMS": 128},
    "torch argmax (old)": {"argmax": False},
    "RoPE + KV append as own kernels (old)": {"fused_qkv": False},
    "all of the above (old)": {"NORM_EPILOGUE": False, "TOPK_TILE_MIN": 1024, "MAX_SPLITS": 16,
                               "DECODE_PROGRAMS": 128, "argmax": False, "fused_qkv": False, "GEMV_PDL": False},
}
PREFILL_VARIANTS = {
    "attention as one tile list, one branch per tile (s5)": {"PREFILL_LOOPS": False},
    "routing masks by torch ops, not in the kernels (s4)": {"fold_routing": False},
    "KV store + descriptors by torch ops (old)": {"fused_store": False},
    "routing top-k by torch.topk + sort (old)": {"fast_topk": False},
    "attention masks every tile (old)": {"FAST_WHOLE_TILES": False},
    "score tiles 128 rows x 64 blocks (old)": {"SCORE_TILE": (128, 64)},
    "all five old": {"FAST_WHOLE_TILES": False, "SCORE_TILE": (128, 64), "fused_store": False, "fast_topk": False,
                     "fold_routing": False},
}


def variants_decode(model, kv, n):
    base = decode_ms(model, kv, n)
    RESULTS[f"variant_decode_{n}"] = {"this run's defaults": base}
    say(f"   decode @ {n} variants: this run's defaults {base:.3f} ms/token")
    for name, kw in DECODE_VARIANTS.items():
        kw = dict(kw)
        model.fast_argmax = kw.pop("argmax", True)
        model.fused_qkv = kw.pop("fused_qkv", True)
        with knobs(**kw):
            ms = decode_ms(model, kv, n)
        model.fast_argmax = model.fused_qkv = True
        RESULTS[f"variant_decode_{n}"][name] = ms
        say(f"      {name:44s} {ms:.3f} ms/token ({ms - base:+.3f})")


def variants_prefill(model, kv, p0, tag, names=None):
    toks = torch.randint(0, model.s.vocab, (4096,), device="cuda")
    run = lambda: model.prefill(toks, kv, p0)
    run()
    base = timed(run, 3)
    RESULTS[f"variant_prefill_{tag}"] = {"this run's defaults": base}
    say(f"   one 4096-token prefill chunk at {p0} variants: this run's defaults {base:.1f} ms")
    for name, kw in PREFILL_VARIANTS.items():
        if names is not None and name not in names:
            continue
        kw = dict(kw)
        model.fused_store = kw.pop("fused_store", True)
        model.fast_topk = kw.pop("fast_topk", True)
        model.fold_routing = kw.pop("fold_routing", True)
        with knobs(**kw):
            run()
            ms = timed(run, 3)
        model.fused_store = model.fast_topk = model.fold_routing = True
        RESULTS[f"variant_prefill_{tag}"][name] = ms
        say(f"      {name:44s} {ms:.1f} ms ({ms - base:+.1f})")


def profile_decode(model, kv, n, steps=10):
    """Kernel time per graphed decode step, by kernel name (torch.profiler over graph replays)."""
    from torch.profiler import ProfilerActivity, profile

    g = GraphedDecode(model, kv, n)
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            g.replay()
        torch.cuda.synchronize()
    RESULTS[f"profile_{n}"] = kernel_table(
        prof, steps, f"profile of one decode step @ {n} (fused GEMV for {', '.join(model.gemv) or 'none'})")


def kernel_table(prof, steps, title):
    rows = [(e.key, e.device_time_total / steps, e.count / steps) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    say(f"   {title}: {total / 1e3:.2f} ms of kernel time")
    for name, us, cnt in rows[:18]:
        say(f"      {us:8.1f} us  {cnt:5.0f}x  {name[:90]}")
    return [(name, us, cnt) for name, us, cnt in rows[:30]]


def profile_prefill_chunk(model, kv, p0, steps=3):
    """Kernel time of one 4096-token prefill chunk at offset p0, by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    toks = torch.randint(0, model.s.vocab, (4096,), device="cuda")
    model.prefill(toks, kv, p0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model.prefill(toks, kv, p0)
        torch.cuda.synchronize()
    RESULTS[f"profile_prefill_{p0}"] = kernel_table(prof, steps, f"profile of one 4096-token prefill chunk at {p0}")


def gemv_shapes(shape):
    """Each decode projection alone: cuBLAS (with its separate norm/SwiGLU kernels) vs fused GEMV."""
    from docqa.kernels.linear import fused_gemv
    from docqa.kernels.norm import fused_rms_norm
    from docqa.kernels.swiglu import fused_swiglu

    bf, s = torch.bfloat16, shape
    x = torch.randn(1, s.hidden, device="cuda", dtype=bf)
    g = torch.ones(s.hidden, device="cuda", dtype=bf)

    def gate_up(w):
        gu = fused_rms_norm(x, g) @ w.t()
        return fused_swiglu(gu[:, :s.ffn], gu[:, s.ffn:])

    cases = {
        "qkv (+rmsnorm)": (torch.randn(s.q_size + 2 * s.kv_size, s.hidden, device="cuda", dtype=bf),
                           lambda w: fused_rms_norm(x, g) @ w.t(), lambda w: fused_gemv(x, w, norm_weight=g)),
        "o (+residual)": (torch.randn(s.hidden, s.q_size, device="cuda", dtype=bf),
                          lambda w: torch.addmm(x, x, w.t()), lambda w: fused_gemv(x, w, residual=x)),
        "gate/up (+rmsnorm, swiglu)": (torch.randn(2 * s.ffn, s.hidden, device="cuda", dtype=bf), gate_up,
                                       lambda w: fused_gemv(x, w, norm_weight=g, swiglu=True)),
        "down (+residual)": (torch.randn(s.hidden, s.ffn, device="cuda", dtype=bf), None, None),
        "lm_head (+rmsnorm)": (torch.randn(s.vocab, s.hidden, device="cuda", dtype=bf),
                               lambda w: fused_rms_norm(x, g) @ w.t(), lambda w: fused_gemv(x, w, norm_weight=g)),
    }
    a = torch.randn(1, s.ffn, device="cuda", dtype=bf)
    w2 = cases["down (+residual)"][0]
    cases["down (+residual)"] = (w2, lambda w: torch.addmm(x, a, w.t()), lambda w: fused_gemv(a, w, residual=x))
    for name, (w, ref_fn, gemv_fn) in cases.items():
        gemv_fn(w)  # autotune outside the timing
        ms_ref = timed(lambda f=ref_fn, m=w: f(m), 50)
        ms_gemv = timed(lambda f=gemv_fn, m=w: f(m), 50)
        gb = w.numel() * 2 / 1e9
        RESULTS[f"gemv_{name}"] = (ms_ref, ms_gemv)
        say(f"   {name:28s} {gb * 1e3:7.1f} MB: cuBLAS path {ms_ref * 1e3:7.1f} us ({gb / ms_ref:5.2f} TB/s), "
            f"fused GEMV {ms_gemv * 1e3:7.1f} us ({gb / ms_gemv:5.2f} TB/s)")


@stage("dense SDPA baseline, bf16 KV")
def dense(model, lengths):
    for n in lengths:
        try:
            kv = KVCache(model.s, n + 8, layout="head")
            toks = torch.randint(0, model.s.vocab, (n,), device="cuda")
            model.prefill(toks[:4096], kv, mode="dense")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            model.prefill(toks, kv, mode="dense")
            torch.cuda.synchronize()
            RESULTS[f"dense_prefill_{n}_s"] = p = time.time() - t0
            RESULTS[f"dense_peak_{n}_GiB"] = torch.cuda.max_memory_allocated() / 2**30
            RESULTS[f"dense_decode_{n}_ms"] = ms = decode_ms(model, kv, n - 1, mode="dense")
            say(f"   dense @ {n}: prefill {p:.2f} s, decode {ms:.2f} ms/token, peak {RESULTS[f'dense_peak_{n}_GiB']:.1f} GiB")
            del kv
        except torch.OutOfMemoryError as e:
            say(f"   dense @ {n}: out of memory ({str(e)[:80]})")
        torch.cuda.empty_cache()


@stage("HF transformers (LlamaForCausalLM, SDPA attention, its dynamic cache), same shape, random bf16 weights")
def hf(shape, lengths):
    from gpu_hf import hf_figures

    RESULTS.update(hf_figures(shape, lengths, say=say))


@stage("sparse, bf16 KV tiered (GPU ring + pinned CPU memory): 1M context")
def sparse_1m_tiered(model, n):
    """bf16 KV for n tokens does not fit beside the weights: the GPU pool takes what fits (after
    RESERVE_GIB), pinned CPU memory the rest (engine/gpu/tiering.py TieredKVCache)."""
    s = model.s
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    cap = n + 4096 + 256
    per_tok = 2 * s.layers * s.kv_heads * s.head_dim * 2
    seg = 2048
    nb = -(-cap // seg) * seg // model.r.block
    desc = 3 * s.layers * nb * s.kv_heads * s.head_dim * 2
    gpu_tokens = int((free - desc - RESERVE_GIB * 2**30) // per_tok)
    if GPU_KV_GIB is not None:
        gpu_tokens = min(gpu_tokens, int(GPU_KV_GIB * 2**30 // per_tok))
    t0 = time.time()
    kv = TieredKVCache(s, cap, gpu_tokens, block=model.r.block, segment=seg)
    sz = kv.nbytes()
    RESULTS["tiered_1m"] = {"gpu_kv_GiB": sz["gpu_kv"] / 2**30, "host_kv_GiB": sz["host_kv"] / 2**30,
                            "descriptors_GiB": sz["descriptors"] / 2**30, "ring_tokens": kv.ring,
                            "kv_bf16_total_GiB": cap * per_tok / 2**30}
    say(f"   bf16 KV for {cap} tokens: {cap * per_tok / 2**30:.1f} GiB; GPU pool {sz['gpu_kv'] / 2**30:.1f} GiB "
        f"({kv.pin + kv.ring} tokens), pinned CPU pool {sz['host_kv'] / 2**30:.1f} GiB, descriptors (GPU) "
        f"{sz['descriptors'] / 2**30:.1f} GiB; allocated in {time.time() - t0:.1f} s; GPU free was {free / 2**30:.1f} GiB")
    toks = torch.randint(0, s.vocab, (n,), device="cuda")
    model.prefill(toks[:8192], kv)  # compile the tiered kernel variants outside the timing
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    chunks = []
    t0 = time.time()
    model.prefill(toks, kv, chunk_times=chunks)
    torch.cuda.synchronize()
    RESULTS["prefill_1m_s"] = total = time.time() - t0
    RESULTS["chunk_times_1m"] = ct = [(p0, ev[0].elapsed_time(ev[1]) / 1e3) for p0, _, ev in chunks]
    RESULTS["tiered_1m"].update(moves=dict(kv.moves), on_host_tokens=kv.evicted - kv.pin)
    say(f"   prefill {n} tokens (sparse, bf16 KV tiered): {total:.1f} s ({n / total:,.0f} tok/s), measured; "
        f"chunk at 0 {ct[0][1] * 1e3:.0f} ms, at {ct[-1][0]} {ct[-1][1] * 1e3:.0f} ms; "
        f"{kv.moves['segments_to_host']} segments ({kv.moves['bytes_to_host'] / 2**30:.1f} GiB) moved to CPU memory; "
        f"positions {kv.pin}..{kv.evicted - 1} ({(kv.evicted - kv.pin) / n:.1%} of the context) now in CPU memory")
    torch.cuda.reset_peak_memory_stats()
    RESULTS["decode_1m_ms"] = ms = decode_ms(model, kv, n)
    say(f"   decode @ {n}: {ms:.2f} ms/token (bf16 KV tiered: routed blocks in CPU memory read over PCIe in place)")
    if VARIANTS:
        variants_prefill(model, kv, n - 4096, "1m")
    if PROFILE:
        profile_decode(model, kv, n)
        profile_prefill_chunk(model, kv, n - 4096)
    RESULTS["first_token_1m_s"] = ft = first_token_s(model, kv, n)
    say(f"   first token, 64-token question on cached {n}: {ft * 1e3:.1f} ms")
    RESULTS["peak_1m_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    say(f"   peak GPU memory {RESULTS['peak_1m_GiB']:.1f} GiB (of which GPU KV pool {sz['gpu_kv'] / 2**30:.1f})")
    del kv


@stage("sparse, fp8 KV (e4m3) resident on the GPU: 1M context")
def sparse_1m(model, n):
    kv = KVCache(model.s, n + 4096 + 256, dtype=torch.float8_e4m3fn)
    say(f"   KV + descriptors: {kv.nbytes() / 2**30:.1f} GiB (bf16 would be {2 * kv.k.numel() * 2 / 2**30:.0f} GiB)")
    if PREFILL_1M:
        toks = torch.randint(0, model.s.vocab, (n,), device="cuda")
        model.prefill(toks[:8192], kv)  # compile the fp8-KV kernel variants outside the timing
        torch.cuda.synchronize()
    t0 = time.time()
    if PREFILL_1M:
        chunks = []
        model.prefill(toks, kv, chunk_times=chunks)
        torch.cuda.synchronize()
        RESULTS["prefill_1m_fp8_s"] = total = time.time() - t0
        RESULTS["chunk_times_1m_fp8"] = [(p0, ev[0].elapsed_time(ev[1]) / 1e3) for p0, _, ev in chunks]
        say(f"   prefill {n} tokens (sparse, fp8 KV): {total:.1f} s ({n / total:,.0f} tok/s), measured, not extrapolated")
    else:
        kv.fill_random(n)
        torch.cuda.synchronize()
        say(f"   filled {n} random keys/values in {time.time() - t0:.1f} s (a stand-in for a read document)")
    torch.cuda.reset_peak_memory_stats()
    RESULTS["decode_1m_fp8_ms"] = ms = decode_ms(model, kv, n)
    say(f"   decode @ {n}: {ms:.2f} ms/token")
    if VARIANTS:
        variants_prefill(model, kv, n - 4096, "1m")
    if PROFILE:
        profile_decode(model, kv, n)
        profile_prefill_chunk(model, kv, n - 4096)
    RESULTS["first_token_1m_fp8_s"] = ft = first_token_s(model, kv, n)
    say(f"   first token, 64-token question on cached {n}: {ft * 1e3:.1f} ms")
    # prefill cost of one 4096-token chunk deep in the document, for the 1M extrapolation
    toks = torch.randint(0, model.s.vocab, (4096,), device="cuda")
    for p0 in (n // 2, n - 4096):
        RESULTS[f"chunk_at_{p0}_s"] = c = timed(lambda p=p0: model.prefill(toks, kv, p), 3) / 1e3
        say(f"   one 4096-token prefill chunk at offset {p0}: {c:.3f} s")
    RESULTS["peak_1m_fp8_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    say(f"   peak {RESULTS['peak_1m_fp8_GiB']:.1f} GiB")

    # tiering: 2048-token segments (all layers, bf16) between pinned CPU memory and the GPU
    seg_shape = (model.s.layers, 2, 2048, model.s.kv_heads, model.s.head_dim)
    # no disk tier here: one CPU slot stays free so a fetch can evict into it
    tiers = SegmentTiers(seg_shape, torch.bfloat16, gpu_slots=2, cpu_slots=7)
    seg_bytes = math.prod(seg_shape) * 2
    for i in range(8):
        tiers.put(i, torch.randn(seg_shape, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()

    def fetch_all():
        for i in range(8):
            tiers.fetch(i)
        for i in range(8):
            tiers.wait(i)
    ms = timed(fetch_all, 3)
    # each fetch moves one segment in and (LRU eviction) one out
    RESULTS["tier_h2d_plus_d2h_GBps"] = gbps = 8 * 2 * seg_bytes / ms / 1e6
    say(f"   tiering: 8 fetches of {seg_bytes / 2**20:.0f} MiB segments (each evicts one): {ms:.1f} ms, "
        f"{gbps:.1f} GB/s of PCIe traffic")
    g = GraphedDecode(model, kv, n)
    alone = timed(g.replay, 20)

    def both():
        for i in range(8):
            tiers.fetch(i)
        for _ in range(10):
            g.replay()
        for i in range(8):
            tiers.wait(i)
    with_copies = timed(both, 3) / 10
    RESULTS["decode_1m_with_side_stream_copies_ms"] = with_copies
    say(f"   decode while the side stream moves segments: {with_copies:.2f} ms/token (alone {alone:.2f})")


# --- --tiers: promotion (CPU -> GPU hot slots) and the disk tier (engine/gpu/tiering.py) ----------
TIERS = {"context": 262144, "gpu_gib": 8.0, "hot": 16, "steps": 256, "every": 16, "disk_segments": 4,
         "disk_dir": None}


def _warm_topk(model):
    """Routing top-k kernel shapes of a growing context, compiled outside the timings."""
    from docqa.kernels.attention.triton_sparse import fused_decode_topk
    for nb in (256, 512, 1024, 2048, 4096, 8192, 16384):
        fused_decode_topk(torch.randn(8, nb, device="cuda"), model.r.top_k)


def _timed_prefill(model, kv, toks):
    model.prefill(toks[:8192], kv)  # compile the tiered kernel variants outside the timing
    _warm_topk(model)
    torch.cuda.synchronize()
    t0 = time.time()
    model.prefill(toks, kv)
    torch.cuda.synchronize()
    return time.time() - t0


def _decode_run(model, kv, n, steps, *, track: bool, every: int = 0) -> float:
    """ms/token over `steps` graphed greedy steps from position n (wall clock, one sync at the
    end); with `every`, kv.rebalance() between replays every `every` steps (promotion)."""
    usage = kv.usage
    kv.usage = usage if track else None  # the captured step counts picks only when tracking
    try:
        g = GraphedDecode(model, kv, n)
    finally:
        kv.usage = usage
    for _ in range(8):  # warm replays (and the first rebalance's snapshot), then the timed run
        g.replay()
    g.reset()
    torch.cuda.synchronize()
    t0 = time.time()
    for i in range(steps):
        g.replay()
        if every and (i + 1) % every == 0:
            kv.rebalance()
    torch.cuda.synchronize()
    ms = (time.time() - t0) * 1e3 / steps
    del g
    return ms


def _pick_shares(kv) -> dict:
    """Where the (decayed) decode picks of the last rebalance period fell, by table target."""
    if kv._use_host is None:
        return {}
    use = kv._use_host.view(kv.n_seg, kv.sb).sum(1)
    tot = float(use.sum()) or 1.0
    hot = sum(float(use[x]) for x in kv.hot)
    host = sum(float(use[x]) for x in kv.host_lru if x not in kv.hot)
    return {"hot": hot / tot, "host": host / tot, "gpu_ring_or_pin": 1 - (hot + host) / tot}


@stage("tiers: promotion of routed CPU segments to GPU hot slots (bf16 KV tiered, small GPU pool)")
def tiers_promotion(model, n):
    s = model.s
    per_tok = 2 * s.layers * s.kv_heads * s.head_dim * 2
    gpu_tokens = int(TIERS["gpu_gib"] * 2**30 // per_tok)
    kv = TieredKVCache(s, n + 4096 + 512, gpu_tokens, block=model.r.block, segment=2048,
                       hot_segments=TIERS["hot"], track_use=True)
    sz = kv.nbytes()
    say(f"   context {n}: GPU pool {sz['gpu_kv'] / 2**30:.1f} GiB (pin + ring {kv.ring} tokens + {kv.hot_segments} hot "
        f"segments of 2048), pinned CPU pool {sz['host_kv'] / 2**30:.1f} GiB")
    toks = torch.randint(0, s.vocab, (n,), device="cuda")
    pre = _timed_prefill(model, kv, toks)
    out = RESULTS["tiers_promotion"] = {"context": n, "gpu_kv_GiB": sz["gpu_kv"] / 2**30,
                                        "host_kv_GiB": sz["host_kv"] / 2**30, "prefill_s": pre,
                                        "host_share": (kv.evicted - kv.pin) / n}
    say(f"   prefill {n}: {pre:.2f} s; {kv.evicted - kv.pin} tokens ({out['host_share']:.0%}) now in CPU memory")
    steps, every = TIERS["steps"], TIERS["every"]
    out["decode_ms_off"] = off = _decode_run(model, kv, n, steps, track=False)
    say(f"   decode @ {n}, promotion off (no counting): {off:.3f} ms/token ({steps} graphed steps)")
    out["decode_ms_counting"] = cnt = _decode_run(model, kv, n, steps, track=True)
    say(f"   same, picks counted in the graph but no rebalance: {cnt:.3f} ms/token (+{cnt - off:.3f})")
    kv.usage.zero_()
    before = dict(kv.moves)
    out["decode_ms_promotion"] = on = _decode_run(model, kv, n, steps, track=True, every=every)
    moved = {k: kv.moves[k] - before[k] for k in ("promotions", "hot_evictions")}
    out.update(moves=moved, hot_segments_now=len(kv.hot), pick_shares=_pick_shares(kv))
    say(f"   same, rebalance() every {every} steps (up to {kv.max_promote} promotions of 256 MiB each): {on:.3f} "
        f"ms/token ({on - off:+.3f}); {moved['promotions']} promotions, {moved['hot_evictions']} hot evictions; "
        f"last period's picks: {', '.join(f'{k} {v:.1%}' for k, v in out['pick_shares'].items())}")
    # the hot set left in place, counting off: what the promoted segments save per step
    out["decode_ms_hot_kept_no_counting"] = kept = _decode_run(model, kv, n, steps, track=False)
    say(f"   promotion off again with those {len(kv.hot)} hot segments kept: {kept:.3f} ms/token")
    del kv


@stage("tiers: disk as the cold tier (host pool capped; segments of 512 tokens)")
def tiers_disk(model, n):
    """A host pool that holds one decode layer's picks (kv heads x top-k segments) plus room for
    the prefill's moves in flight, a GPU ring for the rest but `disk_segments` segments, which
    go to disk as the prefill ends. Random weights route almost at random, so nearly every layer
    of every later step picks a disk segment: this measures the mechanism's costs."""
    s, r = model.s, model.r
    seg = 512
    host = s.kv_heads * r.top_k + 2 * 4096 // seg + 8
    cap = -(-(n + 4096 + 512) // seg) * seg
    # the ring leaves host + disk_segments segments (after the pin) behind it once n tokens are in
    gpu_tokens = n - (host + TIERS["disk_segments"]) * seg
    d = TIERS["disk_dir"] or tempfile.mkdtemp(prefix="docqa-kv-")
    kv = TieredKVCache(s, cap, gpu_tokens, block=r.block, segment=seg, host_segments=host, disk_dir=d)
    sz = kv.nbytes()
    say(f"   context {n}: GPU pool {sz['gpu_kv'] / 2**30:.1f} GiB (ring {kv.ring} tokens), pinned CPU pool "
        f"{sz['host_kv'] / 2**30:.1f} GiB ({host} segments of {kv.seg_bytes / 2**20:.0f} MiB), disk dir {d}")
    toks = torch.randint(0, s.vocab, (n,), device="cuda")
    pre = _timed_prefill(model, kv, toks)
    m = dict(kv.moves)
    out = RESULTS["tiers_disk"] = {"context": n, "prefill_s": pre, "moves_after_prefill": m,
                                   "on_disk_after_prefill": len(kv.disk)}
    say(f"   prefill {n}: {pre:.2f} s; {len(kv.disk)} segments on disk; {m['segments_to_disk']} host->disk "
        f"({m['segments_to_disk_clean']} of them clean: file kept), {m['segments_from_disk']} disk->host faults, "
        f"{m['fault_checks']} launch checks; disk I/O {m['bytes_disk_io'] / 2**30:.1f} GiB, "
        f"write {m['disk_write_s']:.2f} s, read {m['disk_read_s']:.2f} s")
    # eager decode (a graph cannot fault): a few greedy steps, each faulting what routing picks
    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    pos = torch.tensor([n], dtype=torch.int32, device="cuda")
    kv.prepare(n, n + 64)
    with torch.inference_mode():
        model.decode_step(tok, pos, kv)  # warm
        torch.cuda.synchronize()
        before, steps = dict(kv.moves), 4
        t0 = time.time()
        for _ in range(steps):
            model.decode_step(tok, pos, kv)
        torch.cuda.synchronize()
    ms = (time.time() - t0) * 1e3 / steps
    dm = {k: kv.moves[k] - before[k] for k in before}
    out.update(decode_eager_ms=ms, decode_moves=dm)
    say(f"   eager decode @ {n} with {len(kv.disk)} segments on disk: {ms:.1f} ms/token; per step "
        f"{dm['segments_from_disk'] / steps:.1f} faults, {dm['segments_to_disk'] / steps:.1f} host->disk "
        f"({dm['segments_to_disk_clean'] / steps:.1f} clean), disk read {dm['disk_read_s'] * 1e3 / steps:.0f} ms, "
        f"write {dm['disk_write_s'] * 1e3 / steps:.0f} ms")
    # one fault alone: a segment's file read (page cache, then with its pages dropped first)
    costs = {}
    for cold in (False, True):
        x = max(kv.disk)
        if cold:  # written back first: only clean pages can be dropped
            with open(kv._path(x), "r+b") as f:
                os.fsync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        b = torch.tensor([[x * kv.sb]], device="cuda")
        t0, r0 = time.time(), kv.moves["disk_read_s"]
        kv.fault_in(b)
        costs["cold" if cold else "page_cache"] = {"fault_ms": (time.time() - t0) * 1e3,
                                                   "read_ms": (kv.moves["disk_read_s"] - r0) * 1e3}
    out["one_fault"] = costs
    mb = kv.seg_bytes / 2**20
    say(f"   one fault of a {mb:.0f} MiB segment: " + "; ".join(
        f"{k} {v['fault_ms']:.1f} ms (file read {v['read_ms']:.1f} ms, {mb / max(v['read_ms'], 1e-6):.2f} MiB/ms)"
        for k, v in costs.items()))
    kv.close()
    del kv


def extrapolate_1m(n_1m):
    """Sum of chunk costs over a 1M prefill from measured chunk times (bf16 up to 128K, fp8 at
    n/2 and n); piecewise-linear in the chunk's offset. An extrapolation, reported as such."""
    pts = sorted(RESULTS.get("chunk_times_bf16", []))
    pts = [(p0, t) for p0, t in pts if p0 > 0]  # the first chunk also pays warm-up effects
    if not any(k.startswith("chunk_at_") for k in RESULTS):
        return None  # no chunk deeper than 128K measured (only the --fp8-1m stage times them)
    for key in (f"chunk_at_{n_1m // 2}_s", f"chunk_at_{n_1m - 4096}_s"):
        if key in RESULTS:
            pts.append((int(key.split("_")[2]), RESULTS[key]))
    if len(pts) < 2:
        return None
    pts.sort()
    total = 0.0
    for p0 in range(0, n_1m, 4096):
        lo = max((p for p in pts if p[0] <= p0), default=pts[0])
        hi = min((p for p in pts if p[0] >= p0), default=pts[-1])
        tt = lo[1] if hi[0] == lo[0] else lo[1] + (hi[1] - lo[1]) * (p0 - lo[0]) / (hi[0] - lo[0])
        total += tt
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-dense-128k", action="store_true")
    ap.add_argument("--skip-1m", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true", help="kernel-time table of a graphed decode step at 128K")
    ap.add_argument("--prefill-1m", action="store_true", help="really prefill the 1M context (fp8 KV) instead of "
                    "filling it with random keys; about a minute")
    ap.add_argument("--variants", action="store_true", help="time this session's kernel changes undone one "
                    "by one (decode at 128K, one prefill chunk at 128K and 1M)")
    ap.add_argument("--fp8-1m", action="store_true", help="also the earlier 1M run with fp8 KV resident on the GPU")
    ap.add_argument("--gpu-kv-gib", type=float, help="cap the tiered 1M run's GPU KV pool (more in CPU memory)")
    ap.add_argument("--only-1m", action="store_true", help="skip the 128K / 32K / dense stages")
    ap.add_argument("--hf", action="store_true", help="also HF transformers on the same shape at 32K and 128K "
                    "(prefill in one forward, greedy decode with its dynamic cache), as ratios")
    ap.add_argument("--tiers", action="store_true", help="also the KV tiering stages: decode with promotion of "
                    "CPU segments to GPU hot slots on/off, and the disk tier (prefill, eager decode, fault cost)")
    ap.add_argument("--tiers-context", type=int, default=TIERS["context"], help="context of the --tiers stages")
    ap.add_argument("--tiers-gpu-gib", type=float, default=TIERS["gpu_gib"],
                    help="GPU KV pool of the promotion stage (the rest of the context in CPU memory)")
    ap.add_argument("--tiers-hot", type=int, default=TIERS["hot"], help="hot segment slots of the promotion stage")
    ap.add_argument("--tiers-disk-segments", type=int, default=TIERS["disk_segments"],
                    help="segments the disk stage leaves on disk after its prefill")
    ap.add_argument("--tiers-disk-dir", help="directory for the disk stage's segment files (default: a temp dir)")
    ap.add_argument("--gemv", default=",".join(GEMV_DEFAULT),
                    help=f"decode projections through the fused GEMV, of {','.join(GEMV_ALL)} ('' = all cuBLAS)")
    a = ap.parse_args()
    global PROFILE, PREFILL_1M, VARIANTS, GPU_KV_GIB
    PROFILE, PREFILL_1M, VARIANTS, GPU_KV_GIB = a.profile, a.prefill_1m, a.variants, a.gpu_kv_gib
    p = torch.cuda.get_device_properties(0)
    say(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; torch {torch.__version__}")
    import triton
    say(f"triton {triton.__version__}")
    shape = Shape(layers=4) if a.quick else LLAMA3_8B
    scale = 8 if a.quick else 1
    n32, n128, n1m = 32768 // scale, 131072 // scale, 1048576 // scale
    ceilings()
    pdl_check()
    if not a.only_1m:
        correctness()
    t0 = time.time()
    w = Weights(shape)
    torch.cuda.synchronize()
    say(f"\nweights: {shape.weight_bytes() / 1e9:.1f} GB bf16 random, made in {time.time() - t0:.1f} s; "
        f"weight-read floor per token {shape.weight_bytes() / (RESULTS.get('copy_TBps', 4.3) * 1e12) * 1e3:.2f} ms "
        f"at the measured copy rate")
    model = Model(shape, w, Routing(), gemv=tuple(x for x in a.gemv.split(",") if x))
    if not a.only_1m:
        stage("decode projections one by one (bf16, batch 1)")(gemv_shapes)(shape)
        sparse_bf16(model, n128, n32)
        torch.cuda.empty_cache()
        dense(model, [n32] if a.skip_dense_128k else [n32, n128])
        torch.cuda.empty_cache()
        if a.hf:
            hf(shape, [n32, n128])
    if not a.skip_1m:
        sparse_1m_tiered(model, n1m)
        torch.cuda.empty_cache()
        if a.fp8_1m:
            sparse_1m(model, n1m)
    if a.tiers:
        TIERS.update(context=a.tiers_context // scale, gpu_gib=a.tiers_gpu_gib, hot=a.tiers_hot,
                     disk_segments=a.tiers_disk_segments, disk_dir=a.tiers_disk_dir)
        torch.cuda.empty_cache()
        tiers_promotion(model, TIERS["context"])
        torch.cuda.empty_cache()
        tiers_disk(model, TIERS["context"])
        torch.cuda.empty_cache()
    est = extrapolate_1m(n1m)
    if est is not None:
        RESULTS["prefill_1m_s_extrapolated"] = est

    r = RESULTS
    L = lambda n: f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M"
    rows = [
        (f"decode ms/token @ {L(n32)}", r.get("decode_short_ms"), r.get(f"dense_decode_{n32}_ms"), None),
        (f"decode ms/token @ {L(n128)}", r.get("decode_long_ms"), r.get(f"dense_decode_{n128}_ms"), TARGETS["decode_128k_ms"]),
        (f"decode ms/token @ {L(n1m)} (bf16 KV tiered)", r.get("decode_1m_ms"), None, TARGETS["decode_1m_ms"]),
        (f"decode ms/token @ {L(n1m)} (fp8 KV resident)", r.get("decode_1m_fp8_ms"), None, None),
        (f"prefill s @ {L(n32)}", r.get("prefill_short_s"), r.get(f"dense_prefill_{n32}_s"), None),
        (f"prefill s @ {L(n128)}", r.get("prefill_long_s"), r.get(f"dense_prefill_{n128}_s"), TARGETS["prefill_128k_s"]),
        (f"prefill s @ {L(n1m)} (bf16 KV tiered, measured)", r.get("prefill_1m_s"), None, TARGETS["prefill_1m_s"]),
        (f"prefill s @ {L(n1m)} (fp8 KV resident, measured)", r.get("prefill_1m_fp8_s"), None, None),
        (f"prefill s @ {L(n1m)} EXTRAPOLATED", r.get("prefill_1m_s_extrapolated"), None, TARGETS["prefill_1m_s"]),
        (f"first token s, 64 tok on cached {L(n128)}", r.get("first_token_long_s"), None, None),
        (f"first token s, 64 tok on cached {L(n1m)} (bf16 tiered)", r.get("first_token_1m_s"), None,
         TARGETS["first_token_1m_s"]),
    ]
    # HF transformers at the same contexts (--hf): the library a user would otherwise run
    hf_of = {f"decode ms/token @ {L(n)}": r.get(f"hf_decode_{n}_ms") for n in (n32, n128)}
    hf_of.update({f"prefill s @ {L(n)}": r.get(f"hf_prefill_{n}_s") for n in (n32, n128)})
    say("\n| figure | sparse (ours) | dense SDPA | dense/sparse | HF transformers | HF/sparse | target | meets |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    f = lambda x: "—" if x is None else f"{x:.3g}"
    ratio = lambda ref, sp: f"{ref / sp:.1f}x" if sp and ref else "—"
    for name, sp, de, tg in rows:
        meets = "—" if tg is None or sp is None or a.quick else ("yes" if sp <= tg else "NO")
        hf_v = hf_of.get(name)
        say(f"| {name} | {f(sp)} | {f(de)} | {ratio(de, sp)} | {f(hf_v)} | {ratio(hf_v, sp)} | "
            f"{f(tg) if tg else '—'} | {meets} |")
    say(f"\npeak GPU memory GiB: prefill {L(n128)} {f(r.get('peak_prefill_long_GiB'))}, decode {L(n128)} "
        f"{f(r.get('peak_decode_long_GiB'))}, 1M bf16 tiered {f(r.get('peak_1m_GiB'))}, dense {L(n128)} {f(r.get(f'dense_peak_{n128}_GiB'))}")
    if r.get("errors"):
        say(f"stages with errors: {r['errors']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({k: v for k, v in r.items()}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
