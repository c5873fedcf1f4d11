"""llama.cpp's `llama-bench` on the default GGUF, as a reference for bench/cpu_engine.py (which
runs it next to our engine and HF transformers in one invocation; SPEC §6 CPU row).

llama.cpp is built from source outside the project (never a dependency), e.g. from the
sources vendored in the llama-cpp-python sdist on PyPI:

    pip download --no-deps --no-binary :all: -d /tmp/llamacpp llama-cpp-python
    (cd /tmp/llamacpp && tar xzf llama_cpp_python-*.tar.gz)
    cd /tmp/llamacpp/llama_cpp_python-*/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build --target llama-bench -j2

then, on its own:

    .venv/bin/python bench/llamacpp.py --llama-bench /tmp/llamacpp/.../build/bin/llama-bench --threads 1

llama.cpp runs the Q4_1 weights as stored (its matmuls quantise activations to 8 bits).
Prefill = prompt processing of N tokens from an empty context; decode = generating `decode`
tokens after a context of `depth` tokens (llama-bench's -d), the same as bench/cpu_engine.py's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess


def llama_cpp(bench: str, model: str, threads: int, lengths: list[int], decode: int, depth: int) -> dict:
    """{"prefill": {n: tok/s}, "decode_tok_s", "peak_rss_mib"} from llama-bench, one repetition
    per test (8K prefill takes minutes on one core) after its warm-up."""

    def run(*args: str) -> list[dict]:
        cmd = [bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "json", *args]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    res = {"prefill": {}, "decode_tok_s": None}
    for r in run("-p", ",".join(map(str, lengths)), "-n", "0"):
        res["prefill"][r["n_prompt"]] = r["avg_ts"]
    (r,) = run("-p", "0", "-n", str(decode), "-d", str(depth))
    res["decode_tok_s"] = r["avg_ts"]
    # The children's peak: llama-bench loads the model once per invocation.
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return res


def main() -> None:
    from docqa.engine.default_model import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--depth", type=int, default=512)
    args = ap.parse_args()
    print(json.dumps(llama_cpp(args.llama_bench, str(default_model_path()), args.threads, args.lengths,
                               args.decode, args.depth)))


if __name__ == "__main__":
    main()
