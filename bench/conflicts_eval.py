"""Conflict findings on the fifteen corpus contracts, scored against hand labels.

    .venv/bin/python bench/conflicts_eval.py [--db FILE] [--out bench/results/conflicts.md]

Every flag the within-document conflict rules (`pipelines/answer/conflicts.py`) raise on
the corpus contracts, from the two places a user sees them:
- `review`: the `contract_review` checklist's three `compare` items, evidence-only (each
  compares the passages cited for its two items);
- `summary`: the `[CONFLICT: …]` block of `docqa summarize --evidence-only` (standard
  length), which runs the rules over all of a document's extracted statements;
- `document`: the rules over every sentence of the contract against every other — wider
  than any user path, so that a rule which pairs unrelated clauses shows here first.

Each flag is looked up in `bench/data/conflict_labels.tsv` (one row per flag: document, rule,
both citations, true/false, a one-line reason, both quotes), labelled by reading both sides
in the PDF text. A flag is keyed by document, rule and its two citations (order-free), so the
same claim raised by a review item and by a summary is labelled once. Precision is
true / labelled, per part of `bench/corpus_split.py` (rules were fitted on "tune"); a flag
without a label is counted as wrong and listed, with `--unlabelled FILE` writing its rows
ready to label.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from corpus_split import CORPUS, HELD_OUT_CONTRACTS, TUNE_CONTRACTS, part

LABELS = Path(__file__).parent / "data" / "conflict_labels.tsv"
COLUMNS = ["doc", "rule", "a", "b", "label", "reason", "a_quote", "b_quote"]


@dataclass(frozen=True)
class Flag:
    doc: str  # corpus file name
    source: str  # "review:<compare item>" or "summary"
    rule: str
    a: str  # "p.12 l.3-5"
    b: str
    a_quote: str
    b_quote: str
    text: str

    def key(self) -> tuple[str, str, str, str]:
        x, y = sorted((self.a, self.b))
        return self.doc, self.rule, x, y


def where(c) -> str:
    s = c.span
    return f"p.{s.page} l.{s.line_start}" + (f"-{s.line_end}" if s.line_end != s.line_start else "")


def flag_of(doc: str, source: str, f) -> Flag:
    one = lambda q: " ".join(q.split())  # noqa: E731
    return Flag(doc, source, f.rule, where(f.a), where(f.b), one(f.a.quote), one(f.b.quote), f.text)


def collect(store, contracts: list[Path]) -> list[Flag]:
    """Every flag of the review's compare items and of the evidence-only summaries."""
    from docqa.app.checklist import load_checklist
    from docqa.app.jobs import job_runs
    from docqa.app.review import compare_findings, run_review
    from docqa.app.review_cli import _documents
    from docqa.app.service import AskSettings, Library
    from docqa.pipelines.answer.summarize import document_findings, extract_segment, statement_spans

    docs = _documents(store, contracts)
    checklist = load_checklist("contract_review")
    run_review(store, checklist, docs, job_id="conflicts-eval", settings=AskSettings(evidence_only=True))
    runs = job_runs(store, "conflicts-eval")
    library = Library(store)
    flags: list[Flag] = []
    for doc_id, path in docs:
        name = Path(path).name
        doc = library.load([doc_id])[0][doc_id]
        for item in checklist.comparisons:
            for f in compare_findings(doc, item, {ref: runs[(doc_id, ref)] for ref in item.compare}):
                flags.append(flag_of(name, f"review:{item.id}", f))
        stmts = [s for seg in doc.segments for s in extract_segment(doc, seg, None).statements]
        for f in document_findings(doc, statement_spans(doc_id, stmts)):
            flags.append(flag_of(name, "summary", f))
        for f in document_findings(doc, [(0, len(doc.text))]):
            flags.append(flag_of(name, "document", f))
    return flags


def load_labels(path: Path = LABELS) -> dict[tuple[str, str, str, str], dict]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    out = {}
    for r in rows:
        x, y = sorted((r["a"], r["b"]))
        if r["label"] not in ("true", "false"):
            raise ValueError(f"{path}: label must be true or false, not {r['label']!r}")
        out[(r["doc"], r["rule"], x, y)] = r
    return out


def score(flags: list[Flag], labels: dict) -> dict[str, dict]:
    """Per part: distinct flags, labelled true, labelled false, unlabelled."""
    out = {p: {"flags": 0, "true": 0, "false": 0, "unlabelled": 0} for p in ("tune", "held out")}
    for key in dict.fromkeys(f.key() for f in flags):
        row = out[part(key[0])]
        row["flags"] += 1
        lab = labels.get(key)
        row["unlabelled" if lab is None else lab["label"]] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/tmp/docqa-conflicts-eval.db")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "conflicts.md"))
    ap.add_argument("--unlabelled", help="write the rows of unlabelled flags here (TSV, label left empty)")
    args = ap.parse_args()
    from docqa.app.store import Store

    contracts = sorted(CORPUS / "pdf" / n for n in TUNE_CONTRACTS | HELD_OUT_CONTRACTS)
    t0 = time.perf_counter()
    with Store(args.db) as store:
        flags = collect(store, contracts)
    elapsed = time.perf_counter() - t0
    labels = load_labels()
    scores = score(flags, labels)
    sources: dict[tuple, list[str]] = defaultdict(list)
    for f in flags:
        sources[f.key()].append(f.source)
    first = {f.key(): f for f in reversed(flags)}
    unlabelled = [first[k] for k in dict.fromkeys(f.key() for f in flags) if k not in labels]
    if args.unlabelled:
        with open(args.unlabelled, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, delimiter="\t", lineterminator="\n")
            w.writerow(COLUMNS)
            for f in unlabelled:
                w.writerow([f.doc, f.rule, f.a, f.b, "", f.text, f.a_quote, f.b_quote])

    def pct(s: dict) -> str:
        n = s["flags"]
        return f"{s['true']}/{n} = {s['true'] / n:.0%}" if n else "no flags"

    lines = [
        "# Conflict findings on the corpus contracts, against hand labels", "",
        "Command: `.venv/bin/python bench/conflicts_eval.py` (a fresh `--db`; ingest included).", "",
        f"Flags of the `contract_review` compare items (evidence-only), of the evidence-only summaries' conflict "
        f"block and of the rules over every sentence of each contract, on {len(contracts)} contracts "
        f"({len(TUNE_CONTRACTS)} tune, {len(HELD_OUT_CONTRACTS)} held out), each looked up in "
        f"`bench/data/conflict_labels.tsv` ({len(labels)} labelled flags). Precision = flags labelled true / all "
        f"distinct flags (an unlabelled flag counts as wrong). Run time {elapsed:.0f} s.", "",
        "| part | source | distinct flags | true | false | unlabelled | precision |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, pick in (("all", lambda f: True), ("review", lambda f: f.source.startswith("review:")),
                       ("summary", lambda f: f.source == "summary"), ("document", lambda f: f.source == "document")):
        for p, s in score([f for f in flags if pick(f)], labels).items():
            bold = "**" if name == "all" else ""
            lines.append(f"| {p} | {name} | {s['flags']} | {s['true']} | {s['false']} | {s['unlabelled']} | "
                         f"{bold}{pct(s)}{bold} |")
    lines += ["", "## Flags raised now", "",
              "| contract | part | raised by | rule | sides | label | reason |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for k in sorted(dict.fromkeys(f.key() for f in flags)):
        f, lab = first[k], labels.get(k)
        where = ", ".join(sorted(set(s.split(":", 1)[-1] for s in sources[k])))
        short = f.doc.removeprefix("contract_")[:28]
        lines.append(f"| {short} | {part(f.doc)} | {where} | `{f.rule}` | {f.a} / {f.b} | "
                     f"{lab['label'] if lab else '**unlabelled**'} | {lab['reason'] if lab else ''} |")
    gone = [r for k, r in labels.items() if k not in first]
    counts = defaultdict(lambda: [0, 0])
    for r in gone:
        counts[(part(r["doc"]), r["rule"])][r["label"] == "false"] += 1
    lines += ["", "## Labelled flags no longer raised", "",
              f"{len(gone)} labelled flags (raised by earlier versions of the rules) are not raised now; "
              "their rows and reasons are in the labels file.", "",
              "| part | rule | true | false |", "| --- | --- | ---: | ---: |"]
    for (p, rule), (t, fl) in sorted(counts.items()):
        lines.append(f"| {p} | `{rule}` | {t} | {fl} |")
    out = Path(args.out)
    notes = out.read_text().split("\n## Notes", 1) if out.exists() else []
    text = "\n".join(lines) + "\n"
    print(text)
    if len(notes) == 2:  # the hand-written notes stay
        text += "\n## Notes" + notes[1]
    out.write_text(text)


if __name__ == "__main__":
    main()
