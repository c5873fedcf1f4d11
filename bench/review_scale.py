"""Review throughput by executor: items/s for the same job run serially, in a local process
pool and on Ray (1 and 2 CPU workers), evidence-only and with the default model, in one run;
and whether each run's answers equal the serial run's, item for item.

    .venv/bin/python bench/review_scale.py [--model-items 3] [--out bench/results/review_scale.md]
    .venv/bin/python bench/review_scale.py --address auto --ray-workers 1,8,32   # on a cluster's head node

The job: the three CUAD contracts of the corpus with the contract checklist (all items
evidence-only; the first `--model-items` questions with the model, since one answer takes
seconds on a CPU). Each run is a separate job over the same database, so every run answers
every item. Wall time counts what a user waits for: worker start and model loads included
(Ray's cluster start is shown apart: `ray start` does it once for many jobs).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import time
from pathlib import Path

from docqa.app.service import AskSettings
from docqa.app.checklist import Checklist, load_checklist
from docqa.app.ingest import ingest_path
from docqa.app.executor import ProcessExecutor, RayExecutor, SerialExecutor
from docqa.app.jobs import job_runs
from docqa.app.review import run_review
from docqa.app.store import Store

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
CONTRACTS = sorted((CORPUS / "pdf").glob("contract_*.pdf"))


def answers(store: Store, job: str) -> dict:
    return {key: (run.status, run.answer, [(c.label(), c.quote) for c in run.citations],
                  [(c.label(), c.quote) for c in run.evidence])
            for key, run in job_runs(store, job).items()}


def run(store: Store, docs, checklist: Checklist, settings: AskSettings, job: str, executor) -> dict:
    t0 = time.perf_counter()
    summary = run_review(store, checklist, docs, job_id=job, settings=settings, executor=executor)
    wall = time.perf_counter() - t0
    assert summary.answered_now == summary.total and not summary.failed, summary
    return {"items": summary.total, "wall_s": wall, "items_s": summary.total / wall,
            "answers": answers(store, job)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/tmp/docqa-review-scale.db")
    ap.add_argument("--model-items", type=int, default=3)
    ap.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto) instead of a local 2-CPU one")
    ap.add_argument("--ray-workers", default="1,2", help="worker counts to measure on Ray")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "review_scale.md"))
    args = ap.parse_args()
    import ray

    Path(args.db).unlink(missing_ok=True)
    full = load_checklist("contract_review")
    small = Checklist(name="contract_review_head", items=full.questions[: args.model_items])
    rows, ray_start = [], None
    with Store(args.db) as store:
        t0 = time.perf_counter()
        docs = [(r["doc_id"], r["path"]) for r in (ingest_path(store, f, max_bytes=10**9) for f in CONTRACTS)]
        ingest_s = time.perf_counter() - t0
        for mode, checklist, settings in (
            ("evidence-only", full, AskSettings(evidence_only=True)),
            ("default model", small, AskSettings()),
        ):
            runs = {}
            runs["serial"] = run(store, docs, checklist, settings, f"{mode}-serial", SerialExecutor())
            if settings.evidence_only:
                runs["local pool, 2 processes"] = run(store, docs, checklist, settings, f"{mode}-pool",
                                                      ProcessExecutor(2))
            if ray_start is None:
                t = time.perf_counter()
                local = {"num_cpus": 2} if args.address is None else {"address": args.address}
                ray.init(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False, **local)
                ray_start = time.perf_counter() - t
            for n in map(int, args.ray_workers.split(",")):
                with RayExecutor(workers=n) as ex:
                    runs[f"Ray, {n} CPU worker{'s' * (n > 1)}"] = run(store, docs, checklist, settings,
                                                                     f"{mode}-ray{n}", ex)
            base = runs["serial"]
            for name, r in runs.items():
                same = sum(r["answers"][k] == base["answers"][k] for k in base["answers"])
                rows.append((mode, name, r["items"], r["wall_s"], r["items_s"], r["items_s"] / base["items_s"],
                             f"{same}/{len(base['answers'])}"))
                print(rows[-1], flush=True)
    ray.shutdown()
    lines = [
        "# Review throughput by executor",
        "",
        f"Command: `.venv/bin/python bench/review_scale.py --model-items {args.model_items}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work while measured); "
        f"one run. Job: {len(CONTRACTS)} CUAD contracts from the corpus; evidence-only: the whole "
        f"`contract_review` checklist ({len(full.items)} items a contract); default model: its first "
        f"{args.model_items} questions. Ingest (once, before all runs): {ingest_s:.1f} s. Ray cluster "
        f"start (`ray.init(num_cpus=2)`, once): {ray_start:.1f} s, not in the figures below.",
        "",
        "| mode | executor | items | wall s | items/s | vs serial | answers equal to serial |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {m} | {n} | {i} | {w:.1f} | {s:.3g} | {x:.2f}x | {eq} |" for m, n, i, w, s, x, eq in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
