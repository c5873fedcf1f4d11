"""Evidence retrieval on the corpus's sixteen 10-K filings: is a gold page among the first
1/3/5 distinct pages that `docqa ask --evidence-only` shows?

Two question sets: FinanceBench's 30 questions (`qa/financebench_dev.jsonl` on the five
tuning filings, `qa/financebench_dev_more.jsonl` on the eleven held-out ones; evidence pages
checked by the corpus) and our own 18 on the tuning filings (`bench/data/filings_extra.jsonl`:
each question's answering page found and read by hand, with the figure that answers it).
Retrieval is the product's, with in-memory FTS5 indexes built as the store builds them and
passage vectors made as ingest makes them (`bench/retrieval_eval.py` holds the machinery;
this script only brings the filings and their questions).

    .venv/bin/python bench/filings_eval.py [--cache DIR] [--no-dense] [--out FILE] [--json]

`--cache DIR` keeps the parsed filings and passage vectors between runs (see retrieval_eval).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from docqa.bench.corpus_split import financebench_questions, part
from docqa.bench.retrieval_eval import (FINAL, LEXICAL, PARTS, cost, exhibits_in_place, kind_grid, lexical,
                                        load_corpus, methods, pages_of, product, recall, recall_table, run,
                                        timing_lines)

ROOT = Path(__file__).resolve().parents[1]
OURS = ROOT / "bench" / "data" / "filings_extra.jsonl"
RESULTS = ROOT / "bench" / "results" / "filings.md"
FIGURES = "Figures (recall@5; the regression floors): "


def load_filings(cache: Path | None = None) -> dict:
    return load_corpus("filing_*.pdf", cache)


def questions() -> list[dict]:
    """FinanceBench's questions and ours, each with its `set`, `part` and `gold_pages`."""
    out = [{**g, "set": "financebench", "gold_pages": g["evidence_pages_1based"]} for g in financebench_questions()]
    for line in OURS.open():
        if line.strip():
            g = json.loads(line)
            out.append({**g, "set": "ours", "part": part(g["doc_file"]), "gold_pages": g["evidence_pages_1based"]})
    return out


def evaluate(docs_by_file: dict | None = None, cache: Path | None = None, dense: bool = True) -> dict:
    docs_by_file = docs_by_file or load_filings(cache)
    qs = [g for g in questions() if Path(g["doc_file"]).name in docs_by_file]
    res = run(qs, docs_by_file, (cache or True) if dense else False)
    names = sorted({n for r in res["rows"] for n in r["sig"]})
    res["by_set"] = {}
    for name in ("financebench", "ours"):
        rows = [r for r in res["rows"] if r["g"]["set"] == name]
        res["by_set"][name] = {m: recall(rows, fn) for m, fn in methods(names).items()
                               if dense or m != "dense alone"}
    return res


BEST_BUY = "filing_BESTBUY_2023_10K.pdf"  # the default test run's one filing


def figures(res: dict) -> dict[str, float]:
    """FinanceBench recall@5 per part, of the product and of its lexical signals alone; and
    the lexical recall@5 of Best Buy's questions (both sets), which the default test run checks."""
    fb = res["by_set"]["financebench"]
    out = {f"{label} {p}": round(fb[name][p][5], 3) for label, name in (("product", FINAL), ("lexical", LEXICAL))
           for p in PARTS}
    best_buy = [r for r in res["rows"] if Path(r["g"]["doc_file"]).name == BEST_BUY]
    out["lexical Best Buy"] = round(recall(best_buy, lexical)["all"][5], 3)
    return out


def expected(path: Path = RESULTS) -> dict[str, float]:
    for line in path.read_text().splitlines():
        if line.startswith(FIGURES):
            return json.loads(line[len(FIGURES):])
    raise ValueError(f"{path} has no {FIGURES.strip()!r} line: run this benchmark and add its report")


def question_table(res: dict, set_name: str, part_name: str) -> list[str]:
    lines = ["| filing | question | gold pages | exhibits in place | lexical alone | final | rank |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        g = r["g"]
        if g["set"] != set_name or r["part"] != part_name:
            continue
        shown = pages_of(product(r), r["by_key"])
        before = [pages_of(m(r), r["by_key"]) for m in (exhibits_in_place, lexical)]
        rank = next((i + 1 for i, pg in enumerate(shown) if pg in r["gold"]), None)
        q = g["question"] if len(g["question"]) <= 90 else g["question"][:89] + "…"
        lines.append(f"| {Path(g['doc_file']).stem[7:]} | {q} | {sorted(r['gold'])} | {before[0]} | {before[1]} | "
                     f"{shown} | {rank or '-'} |")
    return lines


def report(res: dict) -> str:
    lines = []
    for set_name, label in (("financebench", "FinanceBench (30 questions)"), ("ours", "ours (18 questions, tuning filings)")):
        rec = res["by_set"][set_name]
        lines += [f"### {label}", "", *recall_table({"recall": rec}), ""]
    lines += timing_lines(res)
    if "dense alone" in res["by_set"]["financebench"]:
        lines += ["", "hits@1/3/5 by kind of question and dense weight (both sets; the product's other weights):",
                  "", *kind_grid(res["rows"])]
    for set_name in ("financebench", "ours"):
        for part_name in PARTS:
            body = question_table(res, set_name, part_name)
            if len(body) > 2:
                lines += ["", f"#### {set_name}, {part_name}", "", *body]
    lines += ["", FIGURES + json.dumps(figures(res), sort_keys=True)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="keep parsed filings and passage vectors here")
    ap.add_argument("--no-dense", action="store_true", help="lexical signals only (no encoder)")
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    ap.add_argument("--json", action="store_true", help="print per-question rows as JSON")
    ap.add_argument("--cost", type=Path, default=None, metavar="PDF",
                    help="instead: what passage vectors cost on this filing (ingest, evidence-only ask)")
    args = ap.parse_args(argv)
    if args.cost:
        text = "\n".join(cost(args.cost, [g["question"] for g in questions() if Path(g["doc_file"]).name == args.cost.name]))
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return 0
    res = evaluate(cache=args.cache, dense=not args.no_dense)
    if args.json:
        text = json.dumps([{"filing": Path(r["g"]["doc_file"]).stem, "set": r["g"]["set"], "part": r["part"],
                            "question": r["question"], "gold": sorted(r["gold"]),
                            "shown": pages_of(product(r), r["by_key"])}
                           for r in res["rows"]], indent=1)
    else:
        text = report(res)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
