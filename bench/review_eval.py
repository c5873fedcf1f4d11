"""A review job over the three CUAD contracts with the contract checklist, scored on the
CUAD gold: for each checklist item that maps to a CUAD category, is a gold page among the
pages the item's answer cites (evidence-only: its top-5 evidence passages)?

    .venv/bin/python bench/review_eval.py [--db FILE] [--out bench/results/review.md]

Only answerable gold questions whose spans carry PDF pages count (spans under 25
characters have none). The checklist's questions are our own words, not CUAD's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from docqa.app.service import AskSettings
from docqa.app.checklist import load_checklist
from docqa.app.jobs import job_runs
from docqa.app.review import run_review
from docqa.app.cli import app as _cli  # noqa: F401  (review_cli is loaded through the CLI)
from docqa.app.review_cli import _documents
from docqa.app.store import Store

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
GOLD = CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl"

ITEM_TO_CUAD = {
    "document_name": "Document Name", "parties": "Parties", "agreement_date": "Agreement Date",
    "effective_date": "Effective Date", "term": "Expiration Date", "renewal_term": "Renewal Term",
    "notice_to_terminate_renewal": "Notice Period To Terminate Renewal", "governing_law": "Governing Law",
    "termination_for_convenience": "Termination For Convenience", "anti_assignment": "Anti-Assignment",
    "change_of_control": "Change Of Control", "exclusivity": "Exclusivity", "non_compete": "Non-Compete",
    "license_grant": "License Grant", "ip_ownership_assignment": "Ip Ownership Assignment",
    "audit_rights": "Audit Rights", "cap_on_liability": "Cap On Liability",
    "liquidated_damages": "Liquidated Damages", "insurance": "Insurance",
    "post_termination_services": "Post-Termination Services", "minimum_commitment": "Minimum Commitment",
    "warranty_duration": "Warranty Duration", "revenue_profit_sharing": "Revenue/Profit Sharing",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/tmp/docqa-review-eval.db")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "review.md"))
    args = ap.parse_args()
    gold = [json.loads(line) for line in GOLD.read_text().splitlines() if line.strip()]
    checklist = load_checklist("contract_review")
    pdfs = sorted({CORPUS / g["doc_file"] for g in gold})
    t0 = time.perf_counter()
    with Store(args.db) as store:
        docs = _documents(store, pdfs)
        t1 = time.perf_counter()
        summary = run_review(store, checklist, docs, job_id="cuad-eval", settings=AskSettings(evidence_only=True))
        t2 = time.perf_counter()
        runs = job_runs(store, "cuad-eval")
        by_path = {Path(p).resolve(): d for d, p in docs}
        rows = defaultdict(lambda: [0, 0, 0])  # category -> [hit@1, hit@5, n]
        for g in gold:
            cat = g["category"]
            item = next((i for i, c in ITEM_TO_CUAD.items() if c.lower() == cat.lower()), None)
            pages = {p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])}
            if item is None or not g["has_answer"] or not pages:
                continue
            run = runs[(by_path[(CORPUS / g["doc_file"]).resolve()], item)]
            cited = list(dict.fromkeys(c.span.page for c in run.evidence))
            r = rows[cat]
            r[0] += bool(cited[:1] and cited[0] in pages)
            r[1] += bool(set(cited[:5]) & pages)
            r[2] += 1
    n = sum(r[2] for r in rows.values())
    h1, h5 = sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())
    lines = [
        "# Review job on the CUAD gold (evidence-only)", "",
        "Command: `.venv/bin/python bench/review_eval.py` (a fresh `--db`; ingest included in wall time).", "",
        f"Job `cuad-eval`: 3 contracts x {len(checklist.items)} items ({len(checklist.questions)} questions, "
        f"{len(checklist.comparisons)} conflict checks), {summary.answered_now} answered now; "
        f"ingest {t1 - t0:.1f} s, review {t2 - t1:.1f} s ({(t2 - t1) / max(1, summary.answered_now) * 1000:.0f} ms/item), "
        f"{summary.conflicts} rule-based conflict finding(s).", "",
        "Page hit: a gold page (CUAD span located in the PDF) is among the distinct pages of the item's "
        "cited evidence — first page (@1) or first five (@5). Answerable gold questions with located spans only.", "",
        "| CUAD category | checklist item | n | hit@1 | hit@5 |", "| --- | --- | ---: | ---: | ---: |",
    ]
    for cat, (a, b, k) in sorted(rows.items()):
        item = next(i for i, c in ITEM_TO_CUAD.items() if c.lower() == cat.lower())
        lines.append(f"| {cat} | `{item}` | {k} | {a}/{k} | {b}/{k} |")
    lines += [f"| **all** | | {n} | **{h1}/{n} = {h1 / n:.0%}** | **{h5}/{n} = {h5 / n:.0%}** |", ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
