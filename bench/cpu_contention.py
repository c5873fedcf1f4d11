"""Decode speed on a shared CPU: the default model's decode tok/s with 0, 1 and 2 competing
busy processes per core, ours vs llama.cpp vs HF transformers, all in one run.

Each engine decodes in its own subprocess while `busy x cores` processes spin
(`while True: pass`) beside it; the slowdown is idle tok/s / busy tok/s. A fair share of
the machine with k busy processes per core is 1/(k+1) of it, so the fair slowdown is k+1
(2x, 3x). Engines and their thread counts, as each would run by default:

- `ours`: engine defaults (generate.default_threads: one thread per core not busy, counted
  when the engine loads; OpenMP threads wait passively, engine/__init__.py);
- `ours-before`: what ours did before issue 17: one thread per core, OpenMP's default wait;
- `hf`: transformers with torch's default (one thread per core, OpenMP's default wait);
- `llamacpp`: llama-bench with -t cores and OpenMP's default wait, as llama.cpp runs when
  started by hand (build it with `.venv/bin/python bench/llamacpp.py --build /tmp/llamacpp-build`);
- `llamacpp-1t`: the same with -t 1, the thread count ours picks on a busy machine (not run
  unless named in --engines).

The measured child imports docqa.engine, which sets OMP_WAIT_POLICY=PASSIVE for our engine;
every engine but `ours` gets it empty instead, so HF and llama.cpp are not run with our fix.

    .venv/bin/python bench/cpu_contention.py --llama-bench PATH [--busy 0 1 2] \
        [--decode-tokens 32] [--depth 128] [--out bench/results/cpu_contention.md]

The machine's own load (other work) is printed before and after; on a machine that is not
otherwise idle, the "0 busy" column is already contended.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES = ("ours", "ours-before", "hf", "llamacpp", "llamacpp-1t")


def cores() -> int:
    return len(os.sched_getaffinity(0))


def child(engine: str, decode: int, depth: int, llama_bench: str | None) -> dict:
    """Runs in the measured subprocess: load, a depth-token prefill, then timed decode."""
    sys.path.insert(0, str(HERE))
    from cpu_engine import run_hf, run_ours

    from docqa.engine.checkpoint import open_checkpoint
    from docqa.engine.default_model import default_model_path
    from docqa.engine.benchmark import bench_prompt
    from docqa.engine.generate import default_threads
    from docqa.engine.tokenizer import Tokenizer

    path = default_model_path()
    if engine.startswith("llamacpp"):
        from llamacpp import llama_cpp

        threads = 1 if engine == "llamacpp-1t" else cores()
        return llama_cpp(llama_bench, str(path), threads, [depth], decode, depth) | {"threads": threads}
    ids = bench_prompt(Tokenizer.from_gguf_metadata(open_checkpoint(path).metadata), depth + decode + 1)
    if engine == "hf":
        return run_hf(path, cores(), [depth], decode, ids) | {"threads": cores()}
    threads = default_threads()  # "ours-before" sets DOCQA_THREADS = cores in its environment
    return run_ours(path, None, [depth], decode, ids) | {"threads": threads}


def measure(engine: str, busy_per_core: int, args) -> dict:
    env = dict(os.environ)
    env.pop("DOCQA_THREADS", None)
    if engine != "ours":
        # Empty (not unset): engine/__init__ leaves a set value alone, and libgomp, after one
        # "Invalid value" line on stderr, applies its default wait (spin a while, then sleep);
        # llama-bench inherits it too.
        env["OMP_WAIT_POLICY"] = ""
    else:
        env.pop("OMP_WAIT_POLICY", None)
    if engine == "ours-before":
        env["DOCQA_THREADS"] = str(cores())
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy_per_core * cores())]
    try:
        time.sleep(1.0)  # the spinners are running (and counted runnable) before the engine loads
        cmd = [sys.executable, __file__, "--child", engine, "--decode-tokens", str(args.decode_tokens),
               "--depth", str(args.depth)] + (["--llama-bench", args.llama_bench] if args.llama_bench else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES[:4]), choices=ENGINES)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2], help="busy processes per core")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--llama-bench")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.decode_tokens, args.depth, args.llama_bench)))
        return

    engines = [e for e in args.engines if not e.startswith("llamacpp") or args.llama_bench]
    load_before = os.getloadavg()
    print(f"load average before: {load_before}", file=sys.stderr)
    results: dict[str, dict[int, dict]] = {}
    # Busy levels outermost: each level hits every engine at about the same time.
    for k in args.busy:
        for e in engines:
            r = measure(e, k, args)
            results.setdefault(e, {})[k] = r
            print(f"{e} busy={k}/core: {r}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    def tok_s(r: dict) -> float | None:
        return r.get("decode_tok_s") if "error" not in r else None

    head = "| engine | threads | " + " | ".join(f"{k} busy/core tok/s" for k in args.busy) + \
        " | " + " | ".join(f"slowdown @{k}" for k in args.busy if k) + " |"
    lines = [head, "|---" * (2 + len(args.busy) + sum(1 for k in args.busy if k)) + "|"]
    for e, by in results.items():
        base = tok_s(by.get(args.busy[0], {}))
        cells = [f"{v:.2f}" if (v := tok_s(by[k])) else by[k].get("error", "-") for k in args.busy]
        slow = [f"{base / v:.1f}x" if base and (v := tok_s(by[k])) else "-" for k in args.busy if k]
        threads = ",".join(str(by[k].get("threads", "?")) for k in args.busy)
        lines.append(f"| {e} | {threads} | " + " | ".join(cells + slow) + " |")
    fair = ", ".join(f"{k + 1}x @{k}" for k in args.busy if k)
    cmd = "`.venv/bin/python bench/cpu_contention.py " + " ".join(sys.argv[1:]) + "`"
    text = "\n".join([
        "# Decode on a shared CPU: ours vs llama.cpp vs HF, idle and with busy competitors",
        "",
        f"Command: {cmd}",
        "",
        f"Machine: {platform.machine()}, {cores()} cores visible, shared with other work: load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (so the '0 busy' column is not idle). "
        f"Default model (SmolLM2-135M Q4_1 GGUF), {args.decode_tokens} tokens decoded after a "
        f"{args.depth}-token prompt, one run each. Fair slowdown: {fair}.",
        "",
        *lines,
        "",
    ])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
