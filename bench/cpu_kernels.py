"""The candidates for products on GGUF weights on the CPU, side by side on one model's real
matrices, in one process (bench/results/cpu_engine.md, "how the kernel was chosen"):

- `gguf`: kernels/linear/gguf_cpu.py on the blocks as stored (int8 activations up to
  DOT_MAX_ROWS rows; past that bf16 slices of dequantised weights through PyTorch's GEMM);
- `int4pack`: PyTorch's weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`, as torchao and
  gpt-fast use it) after a repack at load; it holds 4-bit codes with a bf16 scale and zero per
  32 columns, so it fits Q4_0/Q4_1/Q4_K exactly (up to bf16 scales) but not Q5_K/Q6_K/Q8_0;
  the repack time is PyTorch's `_convert_weight_to_int4pack_for_cpu` alone;
- `int8pack`: PyTorch's weight-only int8 kernel (`_weight_int8pack_mm`), int8 codes with one
  scale per output row: it fits no GGUF type exactly (their scales are per 32 or 16 columns), so
  it stands for any type at the cost of a requantisation;
- `fp32` / `bf16`: F.linear on the dequantised matrix (what a full-precision copy costs).

Times are CPU seconds of this process (`time.process_time`, 1 thread by default), so other
work on a shared machine slows the figures less than wall time would; rows of matrices are
cycled through 4 copies so the weights come from memory, as in a decode step.

    .venv/bin/python bench/cpu_kernels.py --model eval --rows 1 512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

INT4_FITS = (2, 3, 12)  # Q4_0, Q4_1, Q4_K


def cpu_time(fn, repeat: int) -> float:
    fn()
    t = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t) / repeat


def model_path(name: str) -> Path:
    if name == "default":
        from docqa.engine.default_model import default_model_path

        return default_model_path()
    if name == "eval":
        import eval_model

        path = eval_model.path()
        if path is None:
            sys.exit("the evaluation model is not assembled: .venv/bin/python bench/eval_model.py")
        return path
    return Path(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="eval", help="default, eval or a GGUF path")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 512], help="activation rows (tokens)")
    ap.add_argument("--layer", type=int, default=1, help="which layer's matrices")
    args = ap.parse_args()

    from docqa.engine.checkpoint import open_checkpoint
    from docqa.kernels.linear.gguf_cpu import GGUFMatrix, dequantize, gguf_mm

    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(model_path(args.model))
    tensors = ckpt.tensors(quantized=True)
    names = [n for n in tensors if n.startswith(f"model.layers.{args.layer}.") and isinstance(tensors[n], GGUFMatrix)]
    print(f"{ckpt.path.name}, layer {args.layer}, {args.threads} thread(s); ms of CPU time per product")
    print("| matrix | type | rows x cols | M | gguf | int4pack | int8pack | fp32 | bf16 | int4pack / gguf "
          "| int8pack / gguf |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    repack_s = 0.0
    for name in names:
        w = tensors[name]
        copies = [GGUFMatrix(w.blocks.clone(), w.qtype, w.cols) for _ in range(4)]
        f32 = [dequantize(c) for c in copies]
        b16 = [t.bfloat16() for t in f32]
        i8 = [torch.randint(-128, 128, w.shape, dtype=torch.int8) for _ in range(4)]
        i8_scale = torch.rand(w.rows) * 0.01
        fits = w.qtype in INT4_FITS
        if fits:
            codes = torch.randint(0, 16, w.shape, dtype=torch.int32)
            t = time.process_time()
            packed = [torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1) for _ in range(4)]
            repack_s += (time.process_time() - t) / 4
            sz = torch.randn(w.cols // 32, w.rows, 2).bfloat16()
        for m in args.rows:
            x = torch.randn(m, w.cols)
            xb = x.bfloat16()
            repeat = 20 if m <= 8 else 2
            i = iter(range(10 ** 9))
            ours = cpu_time(lambda: gguf_mm(x, [copies[next(i) % 4]]), repeat)
            fp32 = cpu_time(lambda: F.linear(x, f32[next(i) % 4]), repeat)
            bf16 = cpu_time(lambda: F.linear(xb, b16[next(i) % 4]), repeat)
            int4 = cpu_time(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed[next(i) % 4], 32, sz),
                            repeat) if fits else float("nan")
            int8 = cpu_time(lambda: torch.ops.aten._weight_int8pack_mm(x, i8[next(i) % 4], i8_scale), repeat)
            short = name.removeprefix(f"model.layers.{args.layer}.").removesuffix(".weight")
            print(f"| {short} | {w.qtype} | {w.rows} x {w.cols} | {m} | {ours * 1e3:.2f} | {int4 * 1e3:.2f} | {int8 * 1e3:.2f} | "
                  f"{fp32 * 1e3:.2f} | {bf16 * 1e3:.2f} | {int4 / ours:.2f}x | {int8 / ours:.2f}x |")
    n_layers = ckpt.config.n_layers
    print(f"\nint4pack repack of this layer's Q4 matrices: {repack_s:.3f} s of CPU "
          f"(x {n_layers} layers: {repack_s * n_layers:.1f} s at load, before unpacking the GGUF codes)")


if __name__ == "__main__":
    main()
