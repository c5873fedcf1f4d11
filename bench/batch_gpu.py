"""Many sequences at once on one GPU: the engine's batch session (engine/batch.py) against one
request at a time, in one run, on the product's own paths; and the single-stream figures
re-measured in the same run.

A random-weight Llama-3-8B-shaped bf16 checkpoint is written with `transformers` (SmolLM2's
tokenizer, as bench/gpu.py does) and loaded with `Engine.load(dir, device="cuda")`. Then:

- review-shaped work: `--items` prompts (81: three contracts x the contract_review checklist) of
  a shared system prompt and 1K-2.2K tokens of passages each, `--answer-tokens` greedy tokens:
  `Engine.generate` item after item (today's review), then `Engine.generate_batch` of all of
  them: items/s, decode tokens/s, and how many items gave the same tokens;
- `docqa review` as the product runs it (`run_review`, app/review.py) over three contracts and
  the contract_review checklist: items one at a time against the default, which submits a
  job's items together on the CUDA decoder (retrieval, context, free-text answers — see
  `product_review` — verification, the model's verdict, storing);
- `docqa serve` (its `Server` in this process) with `--clients` concurrent clients on
  ~4K-token prompts: aggregate decode tokens/s and per-client latency (first byte, whole
  answer), against the same requests sent one after another. Aggregate decode is reported two
  ways: output tokens over the whole concurrent run (prefill of every prompt included) and
  over the decode phase (from the last client's first token to the last answer's end);
- single stream: the `ask` path (a 4K prompt on the dense state) and `docqa engine bench
  --context N` (engine/benchmark.py `context_benchmark`) at `--contexts`.

Random weights never emit the stop token, so every answer runs to its limit. `--profile` times
the product review's and serve's batched steps by part (engine/batch.py `StepTimes`: host
scheduling, forward launch, device wait, choosers, per-token bookkeeping); bench/serve_host.py
measures the same serve path's host share on the CPU.

    python3 bench/batch_gpu.py --json OUT.json   (on the GPU machine, after bench/gpu_run.sh's set-up)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS: dict = {}
REVIEW_SYSTEM = "You answer questions about the contract below. Quote the clause that answers, with its citation."
FAILED: list[str] = []


def say(*a):
    print(*a, flush=True)


def stage(name: str, fn, *a, **k):
    say(f"== {name}")
    t0 = time.time()
    try:
        out = fn(*a, **k)
        say(f"   {name}: {time.time() - t0:.1f} s")
        return out
    except Exception as e:  # noqa: BLE001 - a failed stage is reported and fails the run
        traceback.print_exc()
        FAILED.append(f"{name}: {type(e).__name__}: {e}"[:300])
        return None


def review_prompts(engine, items: int, system: str = REVIEW_SYSTEM) -> list[list[int]]:
    """A shared system prompt, then 1K-2.2K tokens of passages (1.6K on average: a retrieved
    `ask` prompt of the issue's review was 1,599 tokens) and a question per item."""
    from docqa.engine.benchmark import bench_prompt

    base = bench_prompt(engine.tokenizer, 2816)
    prompts = []
    for i in range(items):
        n = 1024 + (i * 977) % 1152
        start = (i * 131) % 512
        passages = engine.tokenizer.decode(base[start:start + n])
        prompts.append(engine.chat_prompt(f"{passages}\n\nQuestion {i}: which party may terminate, and when?",
                                          system=system))
    return prompts


def review(engine, items: int, answer_tokens: int) -> dict:
    prompts = review_prompts(engine, items)
    # the session's pool, its decode graph for this batch size and the kernels' variants, outside
    # the timing; another system prompt, so the timed prompts find none of their blocks cached
    engine.generate_batch(review_prompts(engine, items, "Warm-up. " + REVIEW_SYSTEM), 2, stop_ids=())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    alone = [engine.generate(p, answer_tokens, stop_ids=()) for p in prompts]
    torch.cuda.synchronize()
    one_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = engine.generate_batch(prompts, answer_tokens, stop_ids=())
    torch.cuda.synchronize()
    batch_s = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in batched)
    same = sum(a.token_ids == b.token_ids for a, b in zip(alone, batched))
    # bf16: a near tie can flip one token and everything after it; how far the others agree
    agree = statistics.mean(next((k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                                 len(a.token_ids)) / max(1, len(a.token_ids)) for a, b in zip(alone, batched))
    out = {"items": items, "prompt_tokens_mean": statistics.mean(len(p) for p in prompts),
           "answer_tokens": answer_tokens, "one_at_a_time_s": one_s, "batched_s": batch_s,
           "items_per_s_one_at_a_time": items / one_s, "items_per_s_batched": items / batch_s,
           "speedup": one_s / batch_s, "decode_tok_s_batched": tokens / batch_s,
           "decode_tok_s_one_at_a_time": sum(len(r.token_ids) for r in alone) / one_s,
           "same_tokens": same, "mean_agreeing_prefix": agree}
    say(f"   review: {out}")
    return out


class OneAtATime:
    """An executor (app/executor.py's protocol) that answers a job's items one after another in
    this process and is not the serial executor, so the review does not batch them: the review
    as it ran before its items were submitted together."""

    shares_database = True

    def map(self, fn, tasks):
        for task in tasks:
            yield task, fn(task)


def warm_graphs(engine) -> None:
    """The batch session's decode graph for every batch size a job can reach, outside the timing."""
    from docqa.engine.gpu.paged import BUCKETS

    for b in (b for b in BUCKETS if b <= engine.batch_session().scheduler.max_seqs):
        engine.generate_batch([[7 + i, 11, 13] for i in range(b)], 2, stop_ids=())


def product_review(engine, ckpt: Path, answer_tokens: int, profile: bool = False) -> dict:
    """`docqa review` as the product runs it (app/review.py `run_review`) over three contracts and
    the contract_review checklist: items one at a time (`OneAtATime`) against the default, which
    submits them together on this CUDA decoder; items/s and how many stored answers agree."""
    from docqa.app.checklist import load_checklist
    from docqa.app.ingest import ingest_path
    from docqa.app.jobs import job_runs
    from docqa.app.models import LoadedEngine
    from docqa.app.review import _worker, run_review
    from docqa.app.service import AskSettings
    from docqa.app.store import Store
    from docqa.engine.batch import StepTimes
    import docqa.fixtures as fx

    work = Path(tempfile.mkdtemp(prefix="docqa-review-"))
    text = (Path(fx.__file__).parent / "sample_contract.txt").read_text(encoding="utf-8")
    # Free-text answers: on random weights the quote constraint's host chooser tries thousands of
    # tokens a step before one extends a quote (a model quoting its source finds one in its first
    # few), so quoted answers here would time that search, not the review; the batched answers'
    # equality under the constraint is tests/test_review_batch.py's.
    settings = AskSettings(model=str(ckpt), device=str(engine.device), max_tokens=answer_tokens, quote=False)
    checklist = load_checklist("contract_review")
    with Store(work / "docqa.db") as store:
        docs = []
        for k, party in enumerate(("Northwind Analytics Inc.", "Bluebird Systems LLC", "Crescent Data Corp.")):
            path = work / f"contract{k}.txt"
            path.write_text(f"Contract {k} with {party}\n\n" + text, encoding="utf-8")
            docs.append((ingest_path(store, path)["doc_id"], str(path)))
        # the engine loaded once, for the job runner's runtime (it would load the checkpoint again)
        _worker(str(store.path.resolve()))._engines[(str(ckpt), str(engine.device))] = LoadedEngine(engine)
        warm_graphs(engine)
        # documents, passage vectors and the question encoder loaded before either timed job
        run_review(store, checklist, docs, job_id="warm", settings=AskSettings(evidence_only=True))
        t0 = time.perf_counter()
        one = run_review(store, checklist, docs, job_id="one", settings=settings, executor=OneAtATime())
        one_s = time.perf_counter() - t0
        session = engine.batch_session()
        session.times = StepTimes() if profile else None
        t0 = time.perf_counter()
        batched = run_review(store, checklist, docs, job_id="batched", settings=settings)
        batch_s = time.perf_counter() - t0
        times, session.times = session.times, None
        a, b = job_runs(store, "one"), job_runs(store, "batched")
    same = sum((r.status, r.answer, r.raw_answer) == (b[k].status, b[k].answer, b[k].raw_answer) for k, r in a.items())
    tokens = lambda runs: sum(r.timings.get("generated_tokens", 0) for r in runs.values())
    out = {"items": one.total, "documents": len(docs), "failed": len(one.failed) + len(batched.failed),
           "one_at_a_time_s": one_s, "batched_s": batch_s, "items_per_s_one_at_a_time": one.answered_now / one_s,
           "items_per_s_batched": batched.answered_now / batch_s, "speedup": one_s / batch_s,
           "generated_tokens": {"one_at_a_time": tokens(a), "batched": tokens(b)},
           "prompt_tokens_mean": statistics.mean(r.timings.get("prompt_tokens", 0) for r in a.values()),
           "same_answers": same}
    if times is not None:
        out["steps"] = times.summary()
    say(f"   product review: {out}")
    return out


def kernel_table(fn, rows: int = 25) -> list[dict]:
    """fn() run again under torch.profiler (its own prompts: no prefix-cache hits), outside the
    timed run (the profiler slows it): the operations and kernels with the most device time,
    printed and returned."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        stats = prof.key_averages()
        key = "self_device_time_total" if hasattr(stats[0], "self_device_time_total") else "self_cuda_time_total"
        events = sorted(stats, key=lambda e: -getattr(e, key))[:rows]
        say(stats.table(sort_by=key, row_limit=rows))
        return [{"name": e.key[:120], "calls": e.count, "self_device_ms": getattr(e, key) / 1e3,
                 "host_ms": e.cpu_time_total / 1e3} for e in events]
    except Exception as e:  # noqa: BLE001 - the profile is extra: its failure leaves the timed figures
        traceback.print_exc()
        return [{"error": f"{type(e).__name__}: {e}"[:300]}]


def serve(engine, clients: int, prompt_tokens: int, answer_tokens: int, profile: bool = False) -> dict:
    """`profile`: the concurrent phase's steps timed by part (engine/batch.py `StepTimes`)."""
    from docqa.app.serve import ServedEngine, Server
    from docqa.engine.batch import StepTimes
    from docqa.engine.benchmark import BENCH_TEXT

    words = BENCH_TEXT.split()
    per = max(1, len(engine.tokenizer.encode(BENCH_TEXT, add_bos=False)) // len(words))
    text = lambda i: f"Request {i}. " + " ".join(words[(i + k) % len(words)] for k in range(prompt_tokens // per))
    srv = Server(ServedEngine(engine, "bench"), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def post(i: int, answer_tokens: int = answer_tokens) -> dict:
        body = {"messages": [{"role": "user", "content": text(i)}], "max_tokens": answer_tokens, "stream": True}
        req = urllib.request.Request(srv.url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        first, usage = None, None
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.startswith(b"data: {") and first is None and b'"content": ""' not in line:
                    first = time.perf_counter()
                if b'"usage"' in line:
                    usage = json.loads(line[6:])["usage"]
        end = time.perf_counter()
        return {"first_s": first - t0, "total_s": end - t0, "tokens": usage["completion_tokens"], "first_at": first,
                "end_at": end}

    def together(first: int, answer_tokens: int = answer_tokens) -> dict[int, dict]:
        got: dict[int, dict] = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, post(i, answer_tokens)))
                   for i in range(first, first + clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    # Each phase sends its own prompts ("Request i." first), so none finds another's blocks in
    # the prefix cache; the warm-up captures the decode graphs the concurrent phase meets.
    session = engine.batch_session()
    try:
        post(0)
        together(2 * clients + 1, 4)
        t0 = time.perf_counter()
        seq = [post(i) for i in range(1, clients + 1)]
        seq_s = time.perf_counter() - t0
        if profile:
            session.times = StepTimes()
        t0 = time.perf_counter()
        got = together(clients + 1)
        conc_s = time.perf_counter() - t0
        times = getattr(session, "times", None)
        session.times = None
        kernels = kernel_table(lambda: together(3 * clients + 1)) if profile and torch.cuda.is_available() else None
    finally:
        srv.shutdown()
        srv.server_close()
    if len(got) != clients:
        raise RuntimeError(f"{clients - len(got)} of {clients} concurrent clients got no answer")
    lat = sorted(r["total_s"] for r in got.values())
    firsts = sorted(r["first_s"] for r in got.values())
    tokens = sum(r["tokens"] for r in got.values())
    # The decode phase: from the last client's first token to the last answer's end (prompts are
    # all prefilled before decode steps start, so in it every client decodes); its tokens are
    # the answers' tokens but their first ones.
    phase_s = max(r["end_at"] for r in got.values()) - max(r["first_at"] for r in got.values())
    out = {"clients": clients, "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens,
           "concurrent_s": conc_s, "sequential_s": seq_s, "decode_tok_s_concurrent": tokens / conc_s,
           "decode_phase_s": phase_s, "decode_phase_tok_s": (tokens - clients) / phase_s,
           "decode_tok_s_sequential": sum(r["tokens"] for r in seq) / seq_s, "speedup": seq_s / conc_s,
           "latency_s": {"p50": lat[len(lat) // 2], "max": lat[-1]},
           "first_token_s": {"p50": firsts[len(firsts) // 2], "max": firsts[-1]}}
    if kernels is not None:
        out["kernels"] = kernels
    if times is not None:
        out["steps"] = times.summary()
        # the engine worker's time outside its steps (queues, adding requests, waiting for work)
        out["steps"]["outside_steps_s"] = conc_s - sum(sum(v.values()) for v in times.seconds.values())
    say(f"   serve: {out}")
    return out


def single_stream(engine, contexts) -> dict:
    from docqa.bench.gpu import ask_path
    from docqa.engine.benchmark import context_benchmark

    out = {"ask": ask_path(engine)}
    say(f"   ask path: {out['ask']}")
    for n in contexts:
        res = context_benchmark(engine, n, say=say)
        out[f"bench_{n}"] = res
        say(f"   engine bench --context {n}: prefill {res['prefill_s']:.2f} s, decode "
            f"{res['decode_ms_per_token']:.2f} ms/token, first token {res['first_token_s'] * 1e3:.1f} ms")
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=81)
    ap.add_argument("--answer-tokens", type=int, default=64)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--serve-prompt-tokens", type=int, default=4096)
    ap.add_argument("--serve-answer-tokens", type=int, default=128)
    ap.add_argument("--contexts", type=int, nargs="*", default=[131072])
    ap.add_argument("--tokenizer", default=str(ROOT / ".gpu" / "tokenizer"))
    ap.add_argument("--profile", action="store_true",
                    help="time the batched steps by part (engine/batch.py StepTimes) in the product review and serve")
    ap.add_argument("--skip", nargs="*", default=[], choices=["review", "product-review", "serve", "single-stream"])
    ap.add_argument("--json")
    a = ap.parse_args()
    from docqa.bench.gpu import write_checkpoint
    from docqa.engine import Engine
    from docqa.kernels.gpu import device_summary

    RESULTS.update(device=device_summary(), torch=torch.__version__, args=vars(a))
    ckpt = Path(tempfile.mkdtemp(prefix="docqa-batch-")) / "llama3-8b"
    stage("write checkpoint", write_checkpoint, "llama3-8b", ckpt, Path(a.tokenizer), max(a.contexts + [8192]) + 8192)
    engine = stage("Engine.load", Engine.load, ckpt, device="cuda")
    if engine is not None:
        if "review" not in a.skip:
            RESULTS["review"] = stage("review: one at a time vs batched", review, engine, a.items, a.answer_tokens)
        if "product-review" not in a.skip:
            RESULTS["product_review"] = stage("docqa review (run_review): one at a time vs submitted together",
                                              product_review, engine, ckpt, a.answer_tokens, a.profile)
        if "serve" not in a.skip:
            RESULTS["serve"] = stage("docqa serve: sequential vs concurrent clients", serve, engine, a.clients,
                                     a.serve_prompt_tokens, a.serve_answer_tokens, a.profile)
        if "single-stream" not in a.skip:
            RESULTS["single_stream"] = stage("single stream", single_stream, engine, a.contexts)
    RESULTS["failed"] = FAILED
    if a.json:
        Path(a.json).write_text(json.dumps(RESULTS, indent=1, default=str))
    say(f"failed stages: {FAILED}" if FAILED else "all stages ok")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
