"""Evidence retrieval on the corpus's five 10-K filings: is a gold page among the first five
distinct pages that `docqa ask --evidence-only` shows?

Two question sets: FinanceBench's 19 questions (`qa/financebench_dev.jsonl`, evidence pages
checked by the corpus) and our own (`bench/data/filings_extra.jsonl`: each question's
answering page found and read by hand, with the figure that answers it). Retrieval is the
product's `retrieve()` with in-memory FTS5 indexes built as the store builds them.

    .venv/bin/python bench/filings_eval.py [--cache DIR] [--out FILE] [--docs PICKLE]

`--cache` keeps the PDF parser's output for the filings between runs, keyed by the source of
the parser (`pipelines/ingest/pdf.py`, `document.py`), so a change to the parser re-parses and
nothing stale is measured; structure, anchors and segments are rebuilt on every run. `--docs` reads
a pickle of {file name: Document} instead (how the "before" row was measured: the filings
parsed by the previous commit's code).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time
from pathlib import Path

from docqa.pipelines.ingest.passages import make_passages
from docqa.pipelines.answer.qa import evidence_passages
from docqa.pipelines.answer.memory_fts import MemoryFts, MemoryPageFts
from docqa.pipelines.answer.retrieval import retrieve, top_pages

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
SETS = {"financebench": CORPUS / "qa" / "financebench_dev.jsonl",
        "ours": ROOT / "bench" / "data" / "filings_extra.jsonl"}
EVIDENCE = 5  # distinct pages shown as evidence (AskSettings.evidence)
POOL = 40  # passages retrieved, as app.service's EVIDENCE_POOL


PARSER_MODULES = ("pdf", "document")


def pipeline_hash() -> str:
    h = hashlib.sha256()
    for name in PARSER_MODULES:
        h.update((ROOT / "pipelines" / f"{name}.py").read_bytes())
    return h.hexdigest()[:16]


def load_filings(cache: Path | None) -> dict:
    from docqa.pipelines.ingest.build import finish, parse
    from docqa.pipelines.ingest.source import load

    pkl = cache / f"filings-parsed-{pipeline_hash()}.pkl" if cache else None
    parsed = pickle.loads(pkl.read_bytes()) if pkl and pkl.exists() else {}
    docs = {}
    for f in sorted((CORPUS / "pdf").glob("filing_*.pdf")):
        source = load(f)
        if f.name not in parsed:
            t = time.perf_counter()
            parsed[f.name] = parse(source)
            print(f"parsed {f.name}: {len(parsed[f.name][0])} pages in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            if pkl:
                pkl.parent.mkdir(parents=True, exist_ok=True)
                pkl.write_bytes(pickle.dumps(parsed))
        docs[f.name] = finish(source, *parsed[f.name])
    return docs


def questions(name: str) -> list[dict]:
    path = SETS[name]
    return [json.loads(line) for line in path.open() if line.strip()] if path.exists() else []


def evaluate(docs_by_file: dict) -> dict:
    passages = {d.doc_id: make_passages(d) for d in docs_by_file.values()}
    docs = {d.doc_id: d for d in docs_by_file.values()}
    fts, page_fts = MemoryFts(passages, docs), MemoryPageFts(docs)
    out = {}
    for name in SETS:
        rows = []
        for g in questions(name):
            doc = docs_by_file[Path(g["doc_file"]).name]
            ranked = retrieve(g["question"], {doc.doc_id: doc}, {doc.doc_id: passages[doc.doc_id]},
                              fts=fts, page_fts=page_fts, k=POOL)
            pages = [pg for _, pg in top_pages(evidence_passages(ranked, EVIDENCE), EVIDENCE)]
            gold = set(g["evidence_pages_1based"])
            first = next((i + 1 for i, pg in enumerate(pages) if pg in gold), None)
            rows.append({"company": Path(g["doc_file"]).stem[7:], "question": g["question"],
                         "gold": sorted(gold), "shown": pages, "rank": first})
        out[name] = rows
    return out


def report(res: dict, label: str) -> str:
    lines = []
    for name, rows in res.items():
        if not rows:
            continue
        n = len(rows)
        at = {k: sum(1 for r in rows if r["rank"] and r["rank"] <= k) for k in (1, 3, 5)}
        lines += [f"### {label}: {name} ({n} questions)", "",
                  f"recall@1 {at[1] / n:.3f}, recall@3 {at[3] / n:.3f}, **recall@5 {at[5] / n:.3f} ({at[5]}/{n})**", "",
                  "| filing | question | gold pages | pages shown | rank |", "| --- | --- | --- | --- | --- |"]
        for r in rows:
            q = r["question"] if len(r["question"]) <= 90 else r["question"][:89] + "…"
            lines.append(f"| {r['company']} | {q} | {r['gold']} | {r['shown']} | {r['rank'] or '-'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="keep parsed filings here")
    ap.add_argument("--docs", type=Path, default=None, help="a pickle of {file name: Document} to measure instead")
    ap.add_argument("--label", default="this commit")
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    ap.add_argument("--json", action="store_true", help="print per-question rows as JSON")
    args = ap.parse_args(argv)
    docs = pickle.loads(args.docs.read_bytes()) if args.docs else load_filings(args.cache)
    res = evaluate(docs)
    text = json.dumps(res, indent=1) if args.json else report(res, args.label)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
