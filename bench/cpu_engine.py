"""CPU benchmark on a GGUF, one invocation: our engine vs HF transformers vs llama.cpp
(`llama-bench`, built outside the project, see bench/llamacpp.py), same thread count, same
contract-like prompt text, table with ratios. `--model`: the default model, the evaluation
model (`eval`, Qwen2.5-Coder-1.5B Q4_K_M, bench/eval_model.py) or a GGUF path.

Prefill: N tokens from an empty context. Decode: tokens generated after a context of the
shortest prefill length (llama-bench's -d), greedy. Each engine runs in its own subprocess so
its peak RSS is its own. Example:

    DOCQA_THREADS=1 .venv/bin/python bench/cpu_engine.py --threads 1 --lengths 512 2048 8192 \
        --llama-bench /tmp/llamacpp-build/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench

Engines: `ours` (Engine.load's default: the GGUF blocks as stored), `ours:fp32` (every weight
dequantised to fp32, the reference path), `hf`, `llamacpp`. Load is Engine.load's wall time
(HF: from_pretrained's; llama-bench does not report one).
"decode tok/CPU-s" is decode steps per second of the process's CPU time (llama.cpp: its
children's), measured as the difference of two runs that differ only in their number of steps:
on a shared machine wall time swings with the other work far more than CPU time does (HF: not measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


# llama-bench runs a warm-up pass before it times anything; ours and HF get one too (a short
# prefill and a few decode steps), so first-call set-up is not counted against the first length.
WARMUP = 64


def run_ours(path, threads, lengths, decode, ids, mode="auto"):
    from llamacpp import CPU_EXTRA_STEPS
    import torch
    from docqa.engine import Engine
    from docqa.engine.benchmark import peak_rss_mib

    t, cpu = time.perf_counter(), time.process_time()
    engine = Engine.load(path, threads=threads, device="cpu", decode_weights=mode)
    out = {"load_s": time.perf_counter() - t, "load_cpu_s": time.process_time() - cpu, "prefill": {},
           "weights": engine.model.decode_weights["mode"]}
    engine.generate(ids[:WARMUP], 4, stop_ids=())
    for n in lengths:
        state = engine.new_state(capacity=n + 1)
        t = time.perf_counter()
        engine.model(torch.tensor(ids[:n]), state, last_only=True, chunk_size=engine.prefill_chunk)
        out["prefill"][n] = n / (time.perf_counter() - t)
    res = engine.generate(ids[:min(lengths)], decode + 1, stop_ids=())
    out["decode_tok_s"] = res.decode_tok_s
    # Decode steps per second of CPU time: two generations that differ only in their number of
    # steps, as llama.cpp's figure (llamacpp.CPU_EXTRA_STEPS).
    cpu = []
    for n in (decode + 1, (1 + CPU_EXTRA_STEPS) * decode + 1):
        c = time.process_time()
        engine.generate(ids[:min(lengths)], n, stop_ids=())
        cpu.append(time.process_time() - c)
    out["decode_cpu_tok_s"] = CPU_EXTRA_STEPS * decode / (cpu[1] - cpu[0])
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def run_hf(path, threads, lengths, decode, ids):
    import torch
    import transformers
    from docqa.engine.benchmark import peak_rss_mib

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    out = {"load_s": time.perf_counter() - t, "prefill": {}}
    with torch.inference_mode():
        res = model(torch.tensor([ids[:WARMUP]]), use_cache=True, logits_to_keep=1)
        for _ in range(4):
            res = model(res.logits[:, -1].argmax(-1, keepdim=True), cache=res.past_key_values, use_cache=True)
        for n in lengths:
            t = time.perf_counter()
            model(torch.tensor([ids[:n]]), use_cache=True, logits_to_keep=1)
            out["prefill"][n] = n / (time.perf_counter() - t)
        res = model(torch.tensor([ids[:min(lengths)]]), use_cache=True, logits_to_keep=1)
        t = time.perf_counter()
        for _ in range(decode):
            tok = res.logits[:, -1].argmax(-1, keepdim=True)
            res = model(tok, cache=res.past_key_values, use_cache=True)
        out["decode_tok_s"] = decode / (time.perf_counter() - t)
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="default, eval or a GGUF path")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--engines", nargs="+", default=["ours", "hf", "llamacpp"])
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (the llamacpp engine)")
    ap.add_argument("--rounds", type=int, default=1, help="engines take turns this many times; medians")
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from docqa.engine.checkpoint import open_checkpoint
    from docqa.engine.benchmark import bench_prompt
    from docqa.engine.tokenizer import Tokenizer

    path = model_path(args.model)
    ids = bench_prompt(Tokenizer.from_gguf_metadata(open_checkpoint(path).metadata),
                       max(args.lengths) + args.decode_tokens + 1)
    if args.only:
        name, _, mode = args.only.partition(":")
        if name == "llamacpp":
            from llamacpp import llama_cpp

            res = llama_cpp(args.llama_bench, str(path), args.threads, args.lengths,
                            args.decode_tokens, min(args.lengths))
        elif name == "ours":
            res = run_ours(path, args.threads, args.lengths, args.decode_tokens, ids, mode or "auto")
        else:
            res = run_hf(path, args.threads, args.lengths, args.decode_tokens, ids)
        print(json.dumps(res))
        return

    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    rounds: dict[str, list[dict]] = {}
    errors: dict[str, dict] = {}
    # Engines take turns, round after round: on a shared machine a slow minute then hurts
    # every engine once instead of one engine every time; each figure is the median.
    for _ in range(args.rounds):
        for name in args.engines:
            if name == "llamacpp" and not args.llama_bench:
                print("llamacpp skipped: no --llama-bench", file=sys.stderr)
                continue
            cmd = [sys.executable, __file__, "--only", name, "--model", args.model, "--threads", str(args.threads),
                   "--decode-tokens", str(args.decode_tokens), "--lengths", *map(str, args.lengths)]
            if args.llama_bench:
                cmd += ["--llama-bench", args.llama_bench]
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if proc.returncode != 0:
                errors[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            rounds.setdefault(name, []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"{name}: {rounds[name][-1]}", file=sys.stderr)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    results = {name: median_result(rs) for name, rs in rounds.items()} | errors
    if args.json:
        print(json.dumps(results))
    else:
        print(format_table(results, args.lengths))


def model_path(name: str) -> Path:
    if name == "default":
        from docqa.engine.default_model import default_model_path

        return default_model_path()
    if name == "eval":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import eval_model

        path = eval_model.path()
        if path is None:
            sys.exit("the evaluation model is not assembled: .venv/bin/python bench/eval_model.py")
        return path
    return Path(name)


def median_result(runs: list[dict]) -> dict:
    """Per figure, the median over rounds (prefill per length, decode, peak RSS)."""
    def med(values):
        return statistics.median(values)

    out = dict(runs[-1])
    out["prefill"] = {n: med([r["prefill"][n] for r in runs]) for n in runs[0]["prefill"]}
    out["decode_tok_s"] = med([r["decode_tok_s"] for r in runs])
    if all(r.get("decode_cpu_tok_s") is not None for r in runs):
        out["decode_cpu_tok_s"] = med([r["decode_cpu_tok_s"] for r in runs])
    out["peak_rss_mib"] = med([r["peak_rss_mib"] for r in runs])
    if all(r.get("load_s") is not None for r in runs):
        out["load_s"] = med([r["load_s"] for r in runs])
    out["rounds"] = len(runs)
    return out


def format_table(results: dict, lengths) -> str:
    ok = {k: v for k, v in results.items() if "error" not in v}
    cols = [f"prefill {n} tok/s" for n in lengths] + [f"decode tok/s @{min(lengths)}", "decode tok/CPU-s",
                                                      "peak RSS MiB", "load s"]

    def row(r):
        return [r["prefill"].get(str(n), r["prefill"].get(n)) for n in lengths] + \
            [r["decode_tok_s"], r.get("decode_cpu_tok_s") or float("nan"), r["peak_rss_mib"],
             r.get("load_s") or float("nan")]

    lines = ["| engine | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in ok.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row(r)) + " |")
    if "ours" in ok:
        for other in [k for k in ok if k != "ours"]:
            ratios = [a / b if b else float("nan") for a, b in zip(row(ok["ours"]), row(ok[other]))]
            lines.append(f"| ours / {other} | " + " | ".join(f"{v:.2f}x" for v in ratios) + " |")
    for name, r in results.items():
        if "error" in r:
            lines.append(f"\n{name} failed: {r['error']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
