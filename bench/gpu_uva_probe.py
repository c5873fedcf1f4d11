"""One-off probe (device; python3 bench/gpu_uva_probe.py): can a Triton kernel read pinned host memory (zero-copy, UVA), passed
directly or as an offset from a GPU base pointer, and at what rate does a block gather run?"""
import time, torch, triton, triton.language as tl


@triton.jit
def _gather(base_ptr, idx_ptr, out_ptr, host_off, n_idx, ROWS: tl.constexpr, W: tl.constexpr, USE_OFF: tl.constexpr):
    p = tl.program_id(0)
    b = tl.load(idx_ptr + p).to(tl.int64)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, W)
    off = (b * ROWS + r)[:, None] * W + c[None, :]
    if USE_OFF:
        off += host_off
    x = tl.load(base_ptr + off).to(tl.float32)
    tl.store(out_ptr + p * W + c, tl.sum(x, axis=0))


def main():
    ROWS, W = 64, 1024  # one 64-token block of one layer's K: 64 x 8 heads x 128 = 128 KiB bf16
    nblk = 16384  # 2 GiB
    print("torch", torch.__version__, "triton", triton.__version__, flush=True)
    h = torch.randn(nblk * ROWS, W, dtype=torch.bfloat16).pin_memory()
    g = torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda")
    print("pinned:", h.is_pinned(), flush=True)
    for n_idx in (512, 4096):
        idx = torch.randint(0, nblk, (n_idx,), device="cuda")
        ref = h.view(nblk, ROWS, W)[idx.cpu()].float().sum(1).cuda()
        out = torch.empty(n_idx, W, device="cuda")
        for name, kw in (("direct", dict(base=h, off=0, use=False)),
                         ("offset", dict(base=g, off=(h.data_ptr() - g.data_ptr()) // 2, use=True))):
            try:
                f = lambda: _gather[(n_idx,)](kw["base"], idx, out, kw["off"], n_idx, ROWS=ROWS, W=W, USE_OFF=kw["use"], num_warps=8)
                out.fill_(float("nan")); f(); torch.cuda.synchronize()
                err = ((out - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(f, warmup=5, rep=50, return_mode="median")
                gb = n_idx * ROWS * W * 2 / 1e9
                print(f"{name:7s} n={n_idx}: rel err {err:.1e}, {ms*1e3:.0f} us, {gb/ms*1e3:.1f} GB/s", flush=True)
            except Exception as e:
                print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    # re-read: the same 256 blocks gathered 16 times in one launch (L2 caching of host reads?)
    idx = torch.randint(0, nblk, (256,), device="cuda").repeat(16)
    out = torch.empty(idx.numel(), W, device="cuda")
    f = lambda: _gather[(idx.numel(),)](h, idx, out, 0, idx.numel(), ROWS=ROWS, W=W, USE_OFF=False, num_warps=8)
    try:
        f(); ms = triton.testing.do_bench(f, warmup=5, rep=50, return_mode="median")
        print(f"re-read 16x of 256 blocks: {ms*1e3:.0f} us ({256*ROWS*W*2/1e9/ms*1e3:.1f} GB/s unique)", flush=True)
    except Exception as e:
        print("re-read FAILED", e)
    hb = torch.empty(512 << 20, dtype=torch.uint8).pin_memory(); gb_ = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    for name, fn in (("h2d", lambda: gb_.copy_(hb, non_blocking=True)), ("d2h", lambda: hb.copy_(gb_, non_blocking=True))):
        ms = triton.testing.do_bench(fn, warmup=3, rep=30, return_mode="median")
        print(f"{name} 512 MiB: {0.5368709/ms*1e3:.1f} GB/s", flush=True)
    free, tot = torch.cuda.mem_get_info()
    print(f"GPU free {free/2**30:.1f} / {tot/2**30:.1f} GiB", flush=True)
    print(open("/proc/meminfo").read()[:200])


main()
