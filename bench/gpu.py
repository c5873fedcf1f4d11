"""The product's engine on one GPU: `Engine.load` of real HF checkpoints, timed on the paths
`docqa` runs — no model of the benchmark's own.

For each architecture (Llama-3-8B and Qwen3-8B shapes) it writes a random-weight bf16
checkpoint with `transformers` (`save_pretrained`, SmolLM2's tokenizer from the default GGUF,
49,152-token vocabulary), loads it with `Engine.load(dir, device="cuda")` exactly as `ask`
does, and measures:

- `ask` over retrieved passages: a ~4K-token prompt through the engine's dense state
  (prefill s, decode ms/token);
- `docqa engine bench --context N` (`context_benchmark`, the `--read-all` path: the engine's
  sparse settings and state factory, tiered KV where it does not fit): prefill s, decode
  ms/token, first token of a 64-token question on the cached context;
- in the same run, on the same checkpoint: exact attention over the whole context (the
  engine's dense state) and HF transformers (`from_pretrained`, SDPA), as ratios;
- `--e2e`: a ~128K-token document made here, `docqa ingest`, then `docqa ask --read-all`
  twice and a default `docqa ask` (retrieved passages, quote-constrained), each a new process
  (wall time, model load, cache load, prefill, time to first token, decode of each).

Run on the GPU machine from a checkout (bench/gpu_run.sh installs the wheels that
scripts/gpu_wheels.sh made and the tokenizer bench/gpu_prepare.py wrote):

    python3 bench/gpu.py --archs llama3-8b qwen3-8b --contexts 32768 131072 1048576 --hf --e2e --json OUT

Exits non-zero when a stage fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS: dict = {"stages": {}}
FAILED: list[str] = []


def say(*a):
    print(*a, flush=True)


def stage(name: str, fn, *a, **k):
    say(f"== {name}")
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.time()
    try:
        out = fn(*a, **k)
        RESULTS["stages"][name] = {"ok": True, "s": round(time.time() - t0, 1)}
        return out
    except Exception as e:  # noqa: BLE001 - a failed stage is reported and fails the run
        traceback.print_exc()
        RESULTS["stages"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        FAILED.append(name)
        torch.cuda.empty_cache()
        return None


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def hf_config(arch: str, max_pos: int):
    import transformers

    common = dict(vocab_size=49152, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  max_position_embeddings=max_pos, tie_word_embeddings=False, rms_norm_eps=1e-5)
    if arch == "llama3-8b":
        return transformers.LlamaConfig(**common, intermediate_size=14336, num_hidden_layers=32,
                                        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    if arch == "qwen3-8b":
        return transformers.Qwen3Config(**common, intermediate_size=12288, num_hidden_layers=36,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    raise ValueError(arch)


def write_checkpoint(arch: str, path: Path, tokenizer_dir: Path, max_pos: int) -> None:
    """Random bf16 weights written by transformers itself (built on the GPU: on the host an
    8B init takes minutes), plus the tokenizer files."""
    import transformers

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config(arch, max_pos))
    finally:
        torch.set_default_dtype(prev)
    model.save_pretrained(path, max_shard_size="5GB")
    del model
    torch.cuda.empty_cache()
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)


def sync():
    torch.cuda.synchronize()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ask_path(engine, prompt_tokens: int = 4096, decode_tokens: int = 64) -> dict:
    """The default `ask` path: a ~4K-token prompt through the dense state, greedy decode."""
    from docqa.engine.benchmark import bench_prompt

    ids = bench_prompt(engine.tokenizer, prompt_tokens)
    runs = [engine.generate(ids, decode_tokens, stop_ids=()) for _ in range(2)]  # Engine.load warmed it up
    # a chooser reads each step's logits on the host, as quote-constrained decoding does; the
    # second also spends 3 ms of host time per token, what pipelines/answer/quote_constraint.py took per
    # token with the default model on the CPU (the decode loop overlaps it with the next step)
    chosen = engine.generate(ids, decode_tokens, stop_ids=(), choose=lambda logits, out: int(logits.argmax()))

    def slow_choice(logits, out):
        t = time.perf_counter() + 0.003
        while time.perf_counter() < t:
            pass
        return int(logits.argmax())

    slow = engine.generate(ids, decode_tokens, stop_ids=(), choose=slow_choice)
    per_token = lambda r: r.decode_s / (len(r.token_ids) - 1) * 1e3
    return {"prompt_tokens": prompt_tokens, "prefill_s": min(r.prefill_s for r in runs),
            "first_call_decode_ms": per_token(runs[0]), "decode_ms": per_token(runs[-1]),
            "host_chosen_decode_ms": per_token(chosen), "host_chosen_3ms_decode_ms": per_token(slow)}


def dense_baseline(engine, n: int, decode_tokens: int = 32) -> dict:
    """Exact attention over the whole context on the same engine and weights: the engine's dense
    state (what `ask` over retrieved passages runs) prefilled with n tokens, then greedy decode
    after them (the first decode captures the state's graph: timed is the second)."""
    from docqa.engine.benchmark import bench_prompt
    from docqa.engine.generate import GREEDY_SYNC_EVERY

    ids = bench_prompt(engine.tokenizer, n + 1)
    state = engine.new_state(n + 1 + decode_tokens + GREEDY_SYNC_EVERY)
    engine.prefill(ids[:1024], state)  # compiles outside the timings
    state.truncate(0)
    sync()
    t0 = time.time()
    engine.prefill(ids[:n], state)
    sync()
    prefill = time.time() - t0
    engine.generate(ids[n:], 2, state=state, stop_ids=())
    state.truncate(n)
    res = engine.generate(ids[n:], decode_tokens, state=state, stop_ids=())
    out = {"prefill_s": prefill, "decode_ms": res.decode_s / max(len(res.token_ids) - 1, 1) * 1e3}
    del state
    torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def hf_reference(path: Path, contexts, decode_steps: int = 8) -> dict:
    """What a user of HF transformers gets on the same checkpoint (`hf_measure`)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda",
                                                              attn_implementation="sdpa").eval()
    out = hf_measure(model, contexts, torch.device("cuda"), decode_steps)
    del model
    torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def hf_measure(model, contexts, device: torch.device, decode_steps: int = 8) -> dict:
    """HF transformers on the same weights: prefill of n tokens in one forward (last position's
    logits), then greedy decode steps with its cache (median ms/step after the first)."""
    import transformers

    out = {"version": transformers.__version__}
    vocab = model.config.vocab_size
    g = torch.Generator(device=device).manual_seed(0)
    for n in contexts:
        past = None
        try:
            ids = torch.randint(0, vocab, (1, n), device=device, generator=g)
            model(input_ids=ids[:, :1024], logits_to_keep=1)
            _sync(device)
            t0 = time.perf_counter()
            res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            _sync(device)
            prefill = time.perf_counter() - t0
            past, tok = res.past_key_values, res.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(decode_steps):
                t1 = time.perf_counter()
                res = model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1)
                tok = res.logits[:, -1:].argmax(-1)
                _sync(device)
                steps.append((time.perf_counter() - t1) * 1e3)
            out[str(n)] = {"prefill_s": prefill, "decode_ms": statistics.median(steps[1:])}
            say(f"   HF transformers @ {n}: prefill {prefill:.2f} s, decode {out[str(n)]['decode_ms']:.1f} ms/token")
        except torch.OutOfMemoryError as e:
            out[str(n)] = {"error": "out of memory"}
            say(f"   HF transformers @ {n}: out of memory ({str(e)[:60]})")
        finally:
            del past
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def logits_vs_hf(engine, path: Path) -> dict:
    """The product's CUDA path (dense state) against HF transformers on the same bf16 weights."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda").eval()
    ids = torch.randint(0, 49152, (512,), generator=torch.Generator().manual_seed(0))
    want = model(input_ids=ids[None].cuda()).logits[0].float()
    got = engine.prefill(ids, engine.new_state(600), all_logits=True)
    del model
    torch.cuda.empty_cache()
    err = (got - want).abs()
    return {"max_abs": err.max().item(), "mean_abs": err.mean().item(), "logit_std": want.std().item(),
            "argmax_agree": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}


def make_document(path: Path, tokenizer, target_tokens: int) -> int:
    """A long text of numbered sections with distinct facts (names, amounts, dates), ~target tokens."""
    import random

    rng = random.Random(0)
    parties = ["Supplier", "Customer", "Licensor", "Licensee", "Agent", "Contractor"]
    verbs = ["shall deliver", "shall pay", "may terminate", "shall indemnify", "shall notify", "shall maintain"]
    parts, n, i = [], 0, 0
    while n < target_tokens:
        i += 1
        body = " ".join(
            f"{i}.{j} The {rng.choice(parties)} {rng.choice(verbs)} within {rng.randint(2, 90)} days an amount of "
            f"${rng.randint(1, 999):,},{rng.randint(100, 999)} under Schedule {rng.randint(1, 40)}, unless the "
            f"{rng.choice(parties)} agrees otherwise in writing before {rng.randint(1, 28)} "
            f"{rng.choice(['March', 'June', 'September', 'December'])} {rng.randint(2026, 2035)}."
            for j in range(1, 9))
        block = f"ARTICLE {i}. OBLIGATIONS OF THE PARTIES, PART {i}\n\n{body}\n\n"
        parts.append(block)
        n += len(tokenizer.encode(block, add_bos=False))
    path.write_text("".join(parts))
    return n


E2E_QUESTIONS = ("What amount must the Supplier pay under Schedule 12?", "Which party may terminate under Article 7?",
                 "What notice period applies to termination for convenience?")


def e2e(ckpt: Path, target_tokens: int, work: Path, device: str = "cuda", retrieved: bool = True, again: bool = True,
        served: bool = True) -> dict:
    """`docqa ingest` a ~target-token document, then `docqa ask --read-all` twice ("first", "second"),
    each a new process; with `retrieved` a default `ask` after them; with `again` the first question
    once more with the document's cached KV removed (a first call once this machine has compiled
    the kernels); with `served` two more through `docqa serve`. Each call names its role."""
    from docqa.engine import Engine

    doc = work / "long_agreement.txt"
    tokens = make_document(doc, Engine.load_tokenizer(ckpt), target_tokens)
    env = dict(os.environ, DOCQA_DB=str(work / "e2e.db"), DOCQA_MODEL=str(ckpt), XDG_CACHE_HOME=str(work / "cache"),
               DOCQA_DEVICE=device)
    cli = [sys.executable, "-c", "from docqa.app.cli import main; main()"]
    t0 = time.time()
    r = subprocess.run(cli + ["ingest", str(doc)], env=env, capture_output=True, text=True)
    say(f"   ingest: rc {r.returncode}, {time.time() - t0:.1f} s {r.stderr.strip()[-200:]}")
    out = {"document_tokens": tokens, "ingest_s": time.time() - t0, "calls": []}
    if r.returncode:
        raise RuntimeError("docqa ingest failed: " + r.stderr[-400:])
    triton_cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    kernels = lambda: {p.name for p in triton_cache.rglob("*.json")} if triton_cache.exists() else set()
    q1, q2, q3 = E2E_QUESTIONS
    calls = [("first", q1, ["--read-all"]), ("second", q2, ["--read-all"]),
             *([("retrieved", q3, [])] if retrieved else []), *([("again", q1, ["--read-all"])] if again else [])]
    for role, q, flags in calls:
        if role == "again":
            shutil.rmtree(work / "cache" / "docqa" / "kv", ignore_errors=True)
        compiled = kernels()
        t0 = time.time()
        r = subprocess.run(cli + ["ask", str(doc), q, *flags, "--json", "--max-tokens", "32"], env=env,
                           capture_output=True, text=True)
        wall = time.time() - t0
        added = sorted(kernels() - compiled)
        call = {"role": role, "question": q, "flags": flags, "rc": r.returncode, "wall_s": wall,
                "triton_cache_files_added": len(added), "kernels_compiled": added}
        try:
            run = json.loads(r.stdout)
            call["timings"] = run.get("timings") or run.get("run", {}).get("timings")
        except ValueError:
            call["stdout_tail"] = r.stdout[-400:]
        call["stderr_tail"] = r.stderr[-400:]
        say(f"   ask {' '.join(flags)}: rc {r.returncode}, wall {wall:.1f} s, {len(added)} kernel files compiled "
            f"{added}, timings {call.get('timings')}")
        out["calls"].append(call)
    served_calls = []
    if served:
        out["served"] = served_read_all(cli, env, doc, device)
        served_calls = out["served"]["calls"]
    if any(c["rc"] for c in out["calls"] + served_calls):
        bad = next(c for c in out["calls"] + served_calls if c["rc"])
        raise RuntimeError("docqa ask failed: " + bad["stderr_tail"])
    return out


def e2e_vs_bench(e2e_out: dict, bench: dict) -> dict:
    """`e2e`'s `--read-all` calls beside `engine bench` of the same checkpoint in the same run:
    the first call's document prefill (and the "again" call's, where run) over the bench's (at the
    document's own prefix length, so both prefill the same tokens), the second call's first token
    (the document from the prefix cache), and each call's answer decode ms/token after its first
    token (the bench's formula)."""
    roles = {c["role"]: c.get("timings") or {} for c in e2e_out["calls"]}
    first, second, last = roles["first"], roles["second"], roles.get("again", {})
    per_token = lambda t: t["decode_s"] / max(t["generated_tokens"] - 1, 1) * 1e3 if "decode_s" in t else None
    prefill = lambda t: t.get("document_prefill_s")
    out = {"document_tokens": first.get("prefix_tokens"), "bench_context": bench["context"],
           "bench_prefill_s": bench["prefill_s"], "bench_decode_ms_per_token": bench["decode_ms_per_token"],
           "bench_first_token_s": bench["first_token_s"],
           "first_call_document_prefill_s": prefill(first),
           "first_call_prefill_over_bench": ratio(prefill(first), bench["prefill_s"]),
           "again_call_document_prefill_s": prefill(last),
           "again_call_prefill_over_bench": ratio(prefill(last), bench["prefill_s"]),
           "second_call_cached_tokens": second.get("cached_tokens"),
           "second_call_first_token_s": second.get("first_token_s"),
           "decode_ms_per_token": {"first_call": per_token(first), "second_call": per_token(second),
                                   "again_call": per_token(last)},
           "generated_tokens": [t.get("generated_tokens") for t in (first, second, last)],
           "load_model_s": [t.get("load_model_s") for t in (first, second, last)]}
    num = lambda v, f=".2f": "-" if v is None else format(v, f)
    dec = out["decode_ms_per_token"]
    say(f"   ask --read-all vs engine bench @ {bench['context']}: document prefill, first call "
        f"{num(prefill(first))} s = {out['first_call_prefill_over_bench']}x the bench's {bench['prefill_s']:.2f} s"
        f"{f', again {num(prefill(last))} s' if last else ''} (target <= 1.15x); second call's first token "
        f"{num(second.get('first_token_s'), '.3f')} s, {num(second.get('cached_tokens'), '.0f')} tokens cached "
        f"(target <= 0.5 s); answer decode {num(dec['first_call'])} / {num(dec['second_call'])} ms/token (first / "
        f"second call; bench {bench['decode_ms_per_token']:.2f}; target <= 10)")
    return out


def summarize_speed(ckpt: Path, pdf: Path) -> dict:
    """`docqa summarize --length detailed` on the contract with this checkpoint on the GPU, as
    bench/summarize_eval.py --speed times it on the CPU (issue 19's wall time and segments/s)."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "summarize_eval.py"), "--speed", "--model", str(ckpt),
                        "--device", "cuda", "--speed-doc", str(pdf)], capture_output=True, text=True, timeout=420)
    if r.returncode:
        raise RuntimeError(f"summarize_eval failed ({r.returncode}): {r.stderr[-600:]}")
    return json.loads(r.stdout)


def served_read_all(cli, env, doc: Path, device: str = "cuda") -> dict:
    """The same two `--read-all` questions through `docqa serve` (one process keeps the engine
    and the document's live KV; each `ask` is a new client process)."""
    serve = subprocess.Popen(cli + ["serve", "--port", "0", "--device", device], env=env, stderr=subprocess.PIPE,
                             text=True)
    t0 = time.time()
    try:
        line = ""
        while " at http" not in line:  # "serving NAME at URL (Ctrl-C stops)", once the engine is loaded
            line = serve.stderr.readline()
            if not line:
                raise RuntimeError(f"docqa serve exited with {serve.wait()}")
        url = line.split(" at ")[1].split()[0]
        out = {"server_start_s": time.time() - t0, "calls": []}
        say(f"   docqa serve up in {out['server_start_s']:.1f} s at {url}")
        for q in ("What amount must the Supplier pay under Schedule 14?", "Which party may terminate under Article 9?"):
            t1 = time.time()
            r = subprocess.run(cli + ["ask", str(doc), q, "--read-all", "--json", "--max-tokens", "32",
                                      "--model", f"openai:{url}"], env=env, capture_output=True, text=True)
            call = {"question": q, "rc": r.returncode, "wall_s": time.time() - t1, "stderr_tail": r.stderr[-400:]}
            try:
                call["timings"] = json.loads(r.stdout).get("timings")
            except ValueError:
                call["stdout_tail"] = r.stdout[-400:]
            say(f"   ask --read-all via serve: rc {r.returncode}, wall {call['wall_s']:.1f} s, timings {call.get('timings')}")
            out["calls"].append(call)
        return out
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["llama3-8b", "qwen3-8b"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 1048576])
    ap.add_argument("--second-contexts", type=int, nargs="+", default=[32768, 131072],
                    help="contexts for architectures after the first")
    ap.add_argument("--hf", action="store_true", help="HF transformers and the engine's dense state on the same checkpoint")
    ap.add_argument("--e2e", action="store_true", help="ingest, ask --read-all twice, then ask, on a ~128K-token document, before the engine bench")
    ap.add_argument("--e2e-tokens", type=int, default=128000)
    ap.add_argument("--e2e-only", action="store_true",
                    help="only the end-to-end calls, with the first architecture")
    ap.add_argument("--summarize", type=Path, default=None, metavar="PDF",
                    help="time `docqa summarize` on this ~100-page contract with the first checkpoint "
                         "(bench/summarize_eval.py --speed)")
    ap.add_argument("--tokenizer", default=str(ROOT / ".gpu" / "tokenizer"))
    ap.add_argument("--work", default=None, help="where checkpoints go (default: a temp dir)")
    ap.add_argument("--json")
    a = ap.parse_args()
    from docqa.engine import Engine
    from docqa.engine.benchmark import context_benchmark
    from docqa.kernels.gpu import device_summary

    RESULTS["device"] = device_summary()
    RESULTS["torch"] = torch.__version__
    say(f"device: {RESULTS['device']}, torch {torch.__version__}")
    work = Path(a.work or tempfile.mkdtemp(prefix="docqa-gpu-"))
    for k, arch in enumerate(a.archs):
        contexts = a.contexts if k == 0 else a.second_contexts
        r = RESULTS[arch] = {}
        ckpt = work / arch
        t0 = time.time()
        if stage(f"{arch}: write checkpoint", write_checkpoint, arch, ckpt, Path(a.tokenizer), max(contexts) + 8192) is None \
                and not (ckpt / "config.json").exists():
            continue
        r["write_s"] = time.time() - t0
        if (a.e2e or a.e2e_only) and k == 0:
            # First, so that on a fresh machine the first `docqa ask` meets an empty Triton cache as a
            # user's does; the engine bench below, in the same run, is its reference.
            r["e2e"] = stage(f"{arch}: e2e ingest + ask --read-all x2", e2e, ckpt, a.e2e_tokens, work)
            if a.e2e_only:
                break
        t0 = time.time()
        engine = stage(f"{arch}: Engine.load", Engine.load, ckpt, device="cuda")
        if engine is None:
            continue
        r["load_s"], r["warm_up_s"] = time.time() - t0, engine.warm_up_s
        say(f"   loaded in {r['load_s']:.1f} s (warm-up {engine.warm_up_s:.2f} s): {type(engine.model).__name__}, "
            f"{engine.dtype}")
        r["logits_vs_hf"] = stage(f"{arch}: logits vs HF transformers", logits_vs_hf, engine, ckpt)
        say(f"   {r['logits_vs_hf']}")
        r["ask"] = stage(f"{arch}: ask path (4K prompt, dense state)", ask_path, engine)
        say(f"   {r['ask']}")
        for n in contexts:
            res = stage(f"{arch}: engine bench --context {n}", context_benchmark, engine, n, say=say)
            r[f"bench_{n}"] = res
            if res:
                say(f"   {n}: prefill {res['prefill_s']:.2f} s, decode {res['decode_ms_per_token']:.2f} ms/token, first "
                    f"token {res['first_token_s'] * 1e3:.1f} ms, {res['state']}, peak {res['peak_memory_gib']:.1f} GiB")
            torch.cuda.empty_cache()
        if a.hf:
            for n in [c for c in contexts if c <= 131072]:
                res = stage(f"{arch}: dense state {n}", dense_baseline, engine, n)
                r[f"dense_{n}"] = res
                say(f"   dense @ {n}: {res}")
        del engine
        torch.cuda.empty_cache()
        if a.summarize and k == 0:
            r["summarize"] = stage(f"{arch}: docqa summarize {a.summarize.name}", summarize_speed, ckpt,
                                   a.summarize.resolve())
            say(f"   {r['summarize']}")
        if a.hf:
            r["hf"] = stage(f"{arch}: HF transformers", hf_reference, ckpt, [c for c in contexts if c <= 131072])
        shutil.rmtree(ckpt, ignore_errors=True)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        if a.json:
            Path(a.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    if a.json:
        Path(a.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    say(f"failed stages: {FAILED}" if FAILED else "all stages ok")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
