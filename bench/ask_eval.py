"""The full `docqa ask` path with a real model on the CUAD gold (SPEC §7, issue 5).

For a sample of CUAD questions (answerable and not), runs `ask()` as the CLI does and reports:
the share of answers with at least one verified citation; the share of shown citations
that verify when re-checked here against the source lines (must be 100%); whether the gold
page is among the answer's cited pages; what happens on unanswerable questions; wall times.
Also asks one question of RFC 9110 (HTML: section-id citations) and times one question on
the 115-page franchise agreement.

    .venv/bin/python bench/ask_eval.py --per-contract 8 --out bench/results/ask.md
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from docqa.app.ask import AskSettings, Library, ask
from docqa.app.store import Store
from docqa.pipelines.ingest import ingest_file
from docqa.pipelines.textnorm import normalize

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"


def recheck(doc, c) -> bool:
    """Independent of the verifier: is the quote on the lines the citation names?"""
    page = next(p for p in doc.pages if (p.label == c.section_id if c.section_id else p.n == c.page))
    # Lines joined by line breaks, as on the page: a word hyphenated at a line end ("non-" /
    # "exclusive") is one word to the normalisation, which it cannot see across a space.
    text = "\n".join(ln.text for ln in page.lines[c.line_start - 1 : c.line_end])
    if c.line_end == len(page.lines) and page.n < len(doc.pages):  # a quote may run onto the next page
        text += "\n" + "\n".join(ln.text for ln in doc.pages[page.n].lines[:3])
    return normalize(c.quote) in normalize(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-contract", type=int, default=8, help="questions per contract (half unanswerable when possible)")
    ap.add_argument("--db", default="/tmp/docqa-ask-eval.db")
    ap.add_argument("--out", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--free-text", action="store_true", help="free-text answers, as before quote-constrained decoding")
    ap.add_argument("--quote-from", type=int, default=0,
                    help="quotes from this many best-ranked passages of the context (0: any passage read)")
    args = ap.parse_args()

    store = Store(args.db)
    gold = [json.loads(line) for line in open(CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl")]
    rng = random.Random(args.seed)
    sample = []
    for f in sorted({g["doc_file"] for g in gold}):
        rows = [g for g in gold if g["doc_file"] == f]
        ans = [g for g in rows if g["has_answer"] and any(s["pdf_pages_1based"] for s in g["gold_spans"])]
        una = [g for g in rows if not g["has_answer"]]
        k_una = min(len(una), args.per_contract // 3)
        sample += rng.sample(ans, args.per_contract - k_una) + rng.sample(una, k_una)
    paths = {g["doc_file"] for g in sample} | {"html/rfc9110_HTTP_Semantics.html"}
    ids = {}
    for rel in sorted(paths):
        doc = ingest_file(CORPUS / rel)
        store.add_document(doc)
        ids[rel] = doc.doc_id
    lib = Library(store)
    settings = AskSettings(model=args.model, max_tokens=160, quote=not args.free_text,
                           quote_from=args.quote_from or None)
    rows = []
    for i, g in enumerate(sample, 1):
        t = time.perf_counter()
        run = ask(store, [ids[g["doc_file"]]], g["question"], settings, library=lib)
        wall = time.perf_counter() - t
        doc = lib.load([ids[g["doc_file"]]])[0][ids[g["doc_file"]]]
        shown = [c for c in run.citations if c.verified]
        gold_pages = {p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])}
        rows.append(dict(
            category=g["category"], answerable=g["has_answer"], status=run.status,
            shown=len(shown), rechecked=sum(recheck(doc, c) for c in shown),
            gold_hit=bool(gold_pages & {c.page for c in shown}),
            evidence_hit=bool(gold_pages & {c.page for c in run.evidence}),
            wall=wall, prompt_tokens=run.timings.get("prompt_tokens"), answer=(run.answer or "")[:160],
        ))
        print(f"[{i}/{len(sample)}] {g['category']:<32} {run.status:<12} shown={len(shown)} {wall:5.1f}s", file=sys.stderr, flush=True)

    rfc_q = "Which status code means the origin server did not find a current representation for the target resource?"
    t = time.perf_counter()
    rfc = ask(store, [ids["html/rfc9110_HTTP_Semantics.html"]], rfc_q, settings, library=lib)
    rfc_wall = time.perf_counter() - t

    ans = [r for r in rows if r["answerable"]]
    una = [r for r in rows if not r["answerable"]]
    shown = sum(r["shown"] for r in rows)
    lines = [
        "# `docqa ask` with the default model on CUAD questions",
        "",
        f"Command: `.venv/bin/python bench/ask_eval.py --per-contract {args.per_contract}`"
        + (f" --model {args.model}" if args.model else "") + (" --free-text" if args.free_text else "") + f" (seed {args.seed})",
        f"Model: {rfc.model}; settings: budget {settings.budget_tokens} tokens, max {settings.max_tokens} new tokens, greedy, "
        + (f"quote-constrained answers (pipelines/quote_constraint.py), quoting from the "
           f"{settings.quote_from or 'all'} best-ranked passages of the context." if settings.quote
           else "free-text answers."),
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| questions (answerable / unanswerable) | {len(rows)} ({len(ans)} / {len(una)}) |",
        f"| answerable: answers with ≥ 1 verified citation | {sum(r['status'] == 'answered' for r in ans)}/{len(ans)} |",
        f"| answerable: gold page among the answer's verified citations | {sum(r['gold_hit'] for r in ans)}/{len(ans)} |",
        f"| answerable: gold page among the evidence shown | {sum(r['evidence_hit'] for r in ans)}/{len(ans)} |",
        f"| shown (verified) citations that re-check against the source lines | {sum(r['rechecked'] for r in rows)}/{shown} |",
        "| unanswerable: status | " + ", ".join(f"{s} {sum(r['status'] == s for r in una)}" for s in ("answered", "not_found", "unsupported")) + " |",
        f"| wall time per question, median / max (s) | {statistics.median(r['wall'] for r in rows):.1f} / {max(r['wall'] for r in rows):.1f} |",
        "",
        f"RFC 9110 (HTML): \"{rfc_q}\" → status {rfc.status}; citations: "
        + (", ".join(c.label() for c in rfc.citations if c.verified) or "none verified")
        + "; top evidence: " + ", ".join(c.label() for c in rfc.evidence[:3]) + f"; {rfc_wall:.1f} s",
        "",
        "| category | gold? | status | shown | re-checked | gold page cited | s | answer (start) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['category']} | {'yes' if r['answerable'] else 'no'} | {r['status']} | {r['shown']} | {r['rechecked']} | "
                     f"{'yes' if r['gold_hit'] else ''} | {r['wall']:.1f} | {r['answer'].replace('|', '/').replace(chr(10), ' ')[:90]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
