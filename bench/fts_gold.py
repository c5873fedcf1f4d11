"""Does the project's own FTS find the CUAD gold spans on their gold pages?

For every gold span that carries `pdf_pages_1based` (spans shorter than 25 characters do
not), search that contract's pages index and count a hit when one of the top-k pages is a
gold page. Two ways to turn a span into a query, both built by `pipelines.fulltext`:

- words: the span's distinctive words (stopwords dropped, each quoted, OR-ed; the same
  builder a user's question goes through), ranked by SQLite's bm25. Robust to spans
  that cross a page or line break, or whose CUAD .txt wording differs slightly from the
  PDF text layer, because no single word is required.
- phrase: the span's first 12 words as one exact FTS5 phrase. Strict: fails when the
  PDF text differs anywhere in those words (hyphenation, a page break, redaction marks).

Each mode is measured for both indexed tokenizers (unicode61 with CJK characters spaced
out, and trigram), on pages and, for comparison, on the ~2048-token segments.

    .venv/bin/python bench/fts_gold.py [--db FILE] [--out bench/results/fts_gold.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from docqa.app.store import Store
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.fulltext import TOKENIZERS, build_match, build_phrase
from docqa.pipelines.ingest.record import make_record

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
GOLD = CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl"
KS = (1, 3, 5)


def gold_spans(gold: Path = GOLD) -> list[dict]:
    """One item per gold span with pages: {doc_file, category, text, pages}."""
    spans = []
    for line in gold.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        for s in rec["gold_spans"]:
            if s.get("pdf_pages_1based"):
                spans.append({"doc_file": rec["doc_file"], "category": rec["category"],
                              "text": s["text"], "pages": set(s["pdf_pages_1based"])})
    return spans


def ingest_contracts(store: Store, spans: list[dict], corpus: Path = CORPUS) -> dict[str, str]:
    """doc_file -> doc_id, ingesting each contract that is not yet in the store."""
    ids = {}
    for doc_file in sorted({s["doc_file"] for s in spans}):
        doc = ingest_file(corpus / doc_file)
        store.add_record(make_record(doc))
        ids[doc_file] = doc.doc_id
    return ids


def evaluate(store: Store, spans: list[dict], ids: dict[str, str], *, tokenizer: str,
             mode: str, unit: str = "pages", k: int = 5) -> dict:
    """Share of spans with a gold page among the top-k hits, plus the misses."""
    hits, misses = 0, []
    for s in spans:
        expr = (build_match(s["text"], tokenizer) if mode == "words"
                else build_phrase(s["text"], tokenizer))
        found = store.search("", [ids[s["doc_file"]]], k, tokenizer=tokenizer, unit=unit,
                             match=expr) if expr else []
        pages = set()
        for h in found:
            pages.update(range(h.span.page, h.span.page_end + 1))
        if pages & s["pages"]:
            hits += 1
        else:
            misses.append({"category": s["category"], "doc": s["doc_file"],
                           "gold": sorted(s["pages"]), "got": [h.span.page for h in found],
                           "text": s["text"][:90]})
    return {"share": hits / len(spans) if spans else 0.0, "hits": hits, "n": len(spans),
            "misses": misses}


CIVIL_CODE = CORPUS / "zh" / "zh_PRC_Civil_Code_2020.pdf"


def chinese_probes(pdf: Path = CIVIL_CODE, every: int = 3, chars: int = 10) -> list[dict]:
    """Chinese queries with known pages, taken from pypdf's own extraction (not ours): on
    every `every`-th page, the middle `chars` characters of its longest line."""
    from pypdf import PdfReader

    probes = []
    reader = PdfReader(pdf)
    for i in range(0, len(reader.pages), every):
        lines = [ln.strip() for ln in (reader.pages[i].extract_text() or "").splitlines()]
        lines = [ln for ln in lines if len(ln) >= chars + 4]
        if not lines:
            continue
        longest = max(lines, key=len)
        mid = (len(longest) - chars) // 2
        probes.append({"doc_file": "zh/" + pdf.name, "category": "civil-code line",
                       "text": longest[mid : mid + chars], "pages": {i + 1}})
    return probes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="store to use (default: a fresh temporary one)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fts_gold.md")
    args = ap.parse_args(argv)
    spans = gold_spans()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db or Path(tmp) / "gold.db")
        t0 = time.perf_counter()
        ids = ingest_contracts(store, spans)
        ingest_s = time.perf_counter() - t0
        zh_spans = chinese_probes()
        zh_ids = ingest_contracts(store, zh_spans)
        rows, details = [], {}
        for unit in ("pages", "segments"):
            for mode in ("words", "phrase"):
                for tok in TOKENIZERS:
                    shares = []
                    for k in KS:
                        t = time.perf_counter()
                        r = evaluate(store, spans, ids, tokenizer=tok, mode=mode, unit=unit, k=k)
                        q_ms = (time.perf_counter() - t) / len(spans) * 1000
                        shares.append(r["share"])
                        if k == 5:
                            details[(unit, mode, tok)] = r
                    rows.append((unit, mode, tok, shares, q_ms))
        zh_rows = []
        for tok in TOKENIZERS:
            shares = [evaluate(store, zh_spans, zh_ids, tokenizer=tok, mode="words", k=k)["share"]
                      for k in KS]
            zh_rows.append((tok, shares))
        store.close()
    lines = [
        "# FTS gold: CUAD spans found on their gold pages",
        "",
        f"Command: `.venv/bin/python bench/fts_gold.py` ({len(spans)} gold spans with pages, "
        f"3 contracts; ingest {ingest_s:.1f} s).",
        "",
        "Hit = a gold page among the top-k hits (for segments: within a hit's page span, so "
        "segments of ~2048 tokens are a much looser test). Queries are restricted to the "
        "span's contract. See the module docstring for the two query modes.",
        "",
        "| unit | query | tokenizer | top-1 | top-3 | top-5 | ms/query (k=5) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for unit, mode, tok, shares, q_ms in rows:
        cells = " | ".join(f"{s:.1%}" for s in shares)
        lines.append(f"| {unit} | {mode} | {tok} | {cells} | {q_ms:.1f} |")
    lines += [
        "",
        f"## Chinese: {len(zh_spans)} probes from the PRC Civil Code",
        "",
        "Each probe is the middle 10 characters of the longest line of every third page, as "
        "pypdf extracts it; hit = that page among the top-k pages (words mode: unicode61 "
        "queries CJK bigrams, trigram queries trigrams).",
        "",
        "| tokenizer | top-1 | top-3 | top-5 |",
        "| --- | --- | --- | --- |",
    ]
    for tok, shares in zh_rows:
        lines.append(f"| {tok} | " + " | ".join(f"{s:.1%}" for s in shares) + " |")
    lines += ["", "## Misses at top-5 on pages", ""]
    for mode in ("words", "phrase"):
        for tok in TOKENIZERS:
            r = details[("pages", mode, tok)]
            lines.append(f"### {mode} / {tok}: {r['hits']}/{r['n']}")
            lines.append("")
            for m in r["misses"]:
                lines.append(f"- {m['category']} ({Path(m['doc']).stem[:30]}): gold {m['gold']}"
                             f" got {m['got']} — “{m['text']}”")
            lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    sys.stdout.write("\n".join(lines[: lines.index("## Misses at top-5 on pages")]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
