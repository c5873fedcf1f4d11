"""Chunked prefill on CPU: the offset-causal attention as two flash calls merged by their
log-sum-exp, against one SDPA call with an explicit offset mask, in one process.

    DOCQA_THREADS=1 .venv/bin/python bench/prefill_attention.py --tokens 4096
"""

import argparse
import time

import torch

import docqa.engine.dense as dense
from docqa.engine.benchmark import bench_prompt
from docqa.engine.generate import Engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=1024)
    args = ap.parse_args()
    engine = Engine.load()
    ids = torch.tensor(bench_prompt(engine.tokenizer, args.tokens))
    flash = dense._FLASH_CPU
    results = {}
    for name, impl in [("two flash + lse merge", flash), ("masked sdpa", None), ("two flash + lse merge", flash)]:
        dense._FLASH_CPU = impl
        state = engine.new_state(capacity=args.tokens)
        t = time.perf_counter()
        with torch.inference_mode():
            logits = engine.model(ids, state, last_only=True, chunk_size=args.chunk)
        rate = args.tokens / (time.perf_counter() - t)
        results.setdefault(name, []).append((rate, logits[-1]))
    ref = results["masked sdpa"][0][1]
    for name, runs in results.items():
        best = max(r for r, _ in runs)
        diff = max(float((lg - ref).abs().max()) for _, lg in runs)
        print(f"{name:<24} {best:7.1f} tok/s   max |logit diff| vs masked {diff:.2e}")


if __name__ == "__main__":
    main()
