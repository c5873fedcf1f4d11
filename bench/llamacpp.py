"""Our engine against llama.cpp on the same GGUF file, in one run (SPEC §6 CPU row).

llama.cpp is built from source outside the project (never a dependency), e.g. from the
sources vendored in the llama-cpp-python sdist on PyPI:

    pip download --no-deps --no-binary :all: -d /tmp/llamacpp llama-cpp-python
    (cd /tmp/llamacpp && tar xzf llama_cpp_python-*.tar.gz)
    cd /tmp/llamacpp/llama_cpp_python-*/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build --target llama-bench -j2

then:

    .venv/bin/python bench/llamacpp.py --llama-bench /tmp/llamacpp/.../build/bin/llama-bench --threads 1

llama.cpp runs the Q4_1 weights as they are (quantised matmuls); our engine dequantises them
to fp32 at load. Prefill = prompt processing of N tokens; decode = generating 64 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from docqa.engine.default_model import default_model_path


def llama_cpp(bench: str, model: str, threads: int, lengths: list[int], decode: int) -> dict:
    out = subprocess.run(
        [bench, "-m", model, "-t", str(threads), "-p", ",".join(map(str, lengths)), "-n", str(decode),
         "-r", "2", "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = json.loads(out)
    res = {"prefill": {}, "decode_tok_s": None}
    for r in rows:
        if r.get("n_prompt", 0) and not r.get("n_gen", 0):
            res["prefill"][r["n_prompt"]] = r["avg_ts"]
        elif r.get("n_gen", 0):
            res["decode_tok_s"] = r["avg_ts"]
    return res


def ours(threads: int, lengths: list[int], decode: int) -> dict:
    os.environ["DOCQA_THREADS"] = str(threads)
    import torch

    from docqa.engine.generate import Engine, benchmark

    engine = Engine.load(threads=threads)
    with torch.inference_mode():
        return benchmark(engine, prefill_lengths=tuple(lengths), decode_tokens=decode)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--decode", type=int, default=64)
    args = ap.parse_args()
    model = str(default_model_path())
    lc = llama_cpp(args.llama_bench, model, args.threads, args.lengths, args.decode)
    us = ours(args.threads, args.lengths, args.decode)
    print(f"threads {args.threads}; model {os.path.basename(model)}")
    print("| engine | " + " | ".join(f"prefill {n} tok/s" for n in args.lengths) + " | decode tok/s |")
    print("| --- |" + " --- |" * (len(args.lengths) + 1))
    for name, r in (("llama.cpp (Q4_1)", lc), ("docqa engine (fp32)", us)):
        cells = [f"{r['prefill'].get(n, float('nan')):.1f}" for n in args.lengths]
        print(f"| {name} | " + " | ".join(cells) + f" | {r['decode_tok_s']:.1f} |")
    ratio = [f"{us['prefill'][n] / lc['prefill'][n]:.2f}x" for n in args.lengths if n in lc["prefill"]]
    print("| ours / llama.cpp | " + " | ".join(ratio) + f" | {us['decode_tok_s'] / lc['decode_tok_s']:.2f}x |")


if __name__ == "__main__":
    main()
