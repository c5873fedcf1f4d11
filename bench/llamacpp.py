"""llama.cpp as a reference: `llama-bench` on the default GGUF (for bench/cpu_engine.py and
bench/cpu_contention.py, which run it next to our engine and HF transformers in one invocation;
SPEC §6 CPU row) and `llama-server` (for tests/test_llama_server.py).

llama.cpp is built from source outside the project (never a dependency), CPU only, from the
sources vendored in the llama-cpp-python sdist on PyPI (a package registry, so no other network
is needed), with one command:

    .venv/bin/python bench/llamacpp.py --build /tmp/llamacpp-build

which downloads the pinned sdist (pip download --no-binary), unpacks it and runs

    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_AVX2=ON ... (cmake_flags(): the CPU's own sets)
    cmake --build build --target llama-bench llama-server -j2

under `nice -n 10` (the machine's cores are shared), leaving the binaries in
/tmp/llamacpp-build/llama_cpp_python-VERSION/vendor/llama.cpp/build/bin/. A second run only
rebuilds what changed. Then, on its own:

    .venv/bin/python bench/llamacpp.py --llama-bench /tmp/llamacpp-build/.../build/bin/llama-bench --threads 1

llama.cpp runs the Q4_1 weights as stored (its matmuls quantise activations to 8 bits).
Prefill = prompt processing of N tokens from an empty context; decode = generating `decode`
tokens after a context of `depth` tokens (llama-bench's -d), the same as bench/cpu_engine.py's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

# The llama-cpp-python release whose vendored llama.cpp we build (ggml 0.25.3).
SDIST_VERSION = "0.3.36"
TARGETS = ("llama-bench", "llama-server")
# The x86 instruction sets that -march=native would pick, named one by one from the CPU's own
# flags, all but AMX: a CPU may list amx_tile/amx_int8 while its VM does not let a process use
# tile data, and a GGML_NATIVE=ON build then dies with SIGILL (tileloadd in ggml's AMX matmul) on
# any prompt longer than one token. Naming a set the CPU lacks fails the same way (AVX-VNNI, the
# VEX form, on an AMD EPYC with AVX-512 VNNI: SIGILL in the Q4_1 dot product).
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
)
ISA_FLAGS = {"GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_BMI2": "bmi2",
             "GGML_AVX_VNNI": "avx_vnni", "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi",
             "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16"}


def cmake_flags() -> tuple[str, ...]:
    have = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            break
    return BASE_FLAGS + tuple(f"-D{opt}={'ON' if flag in have else 'OFF'}" for opt, flag in ISA_FLAGS.items())


# The two runs of a CPU-time figure differ by this many times the decode steps (bench/cpu_engine.py
# times ours the same way).
CPU_EXTRA_STEPS = 4


def llama_cpp(bench: str, model: str, threads: int, lengths: list[int], decode: int, depth: int) -> dict:
    """{"prefill": {n: tok/s}, "decode_tok_s", "peak_rss_mib"} from llama-bench, one repetition
    per test (8K prefill takes minutes on one core) after its warm-up."""

    def run(*args: str) -> list[dict]:
        cmd = [bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "json", *args]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    res = {"prefill": {}, "decode_tok_s": None}
    for r in run("-p", ",".join(map(str, lengths)), "-n", "0"):
        res["prefill"][r["n_prompt"]] = r["avg_ts"]
    # Decode also per second of CPU time (less sensitive to a shared machine than wall time):
    # the children's CPU time of two runs that differ only in their number of decode steps, by
    # CPU_EXTRA_STEPS x decode so that the steps outweigh the variation of the rest (load, prefill).
    cpu = []
    for n in (decode, (1 + CPU_EXTRA_STEPS) * decode):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        (r,) = run("-p", "0", "-n", str(n), "-d", str(depth))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if n == decode:
            res["decode_tok_s"] = r["avg_ts"]
    res["decode_cpu_tok_s"] = CPU_EXTRA_STEPS * decode / (cpu[1] - cpu[0])
    # The children's peak: llama-bench loads the model once per invocation.
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return res


def build(dest: Path, jobs: int = 2) -> Path:
    """Downloads the pinned sdist into `dest`, unpacks it, builds TARGETS; returns build/bin."""
    dest.mkdir(parents=True, exist_ok=True)
    sdist = dest / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not sdist.exists():
        print(f"llamacpp: downloading llama-cpp-python {SDIST_VERSION} sdist from PyPI", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                        "--no-binary", ":all:", "-d", str(dest),
                        f"llama-cpp-python=={SDIST_VERSION}"], check=True)
    src = dest / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        print(f"llamacpp: unpacking {sdist.name}", file=sys.stderr)
        with tarfile.open(sdist) as tar:
            tar.extractall(dest, filter="data")
    nice = ["nice", "-n", "10"]  # the cores are shared with other work
    # Configured every time (seconds), so changed flags reach an existing build.
    subprocess.run([*nice, "cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja", *cmake_flags()],
                   check=True)
    print(f"llamacpp: building {' '.join(TARGETS)} with -j{jobs} (tens of minutes on 2 busy cores)",
          file=sys.stderr)
    subprocess.run([*nice, "cmake", "--build", str(src / "build"), "--target", *TARGETS, "-j", str(jobs)],
                   check=True)
    return src / "build" / "bin"


def main() -> None:
    from docqa.engine.default_model import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, metavar="DIR", help="build llama.cpp under DIR (see above) and exit")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for --build")
    ap.add_argument("--llama-bench")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--depth", type=int, default=512)
    args = ap.parse_args()
    if args.build:
        print(build(args.build, args.jobs))
        return
    if not args.llama_bench:
        ap.error("--llama-bench PATH (or --build DIR) is required")
    print(json.dumps(llama_cpp(args.llama_bench, str(default_model_path()), args.threads, args.lengths,
                               args.decode, args.depth)))


if __name__ == "__main__":
    main()
