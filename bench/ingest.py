"""Ingest speed and memory: pages/s and peak RSS for every corpus PDF, and in total.

Each PDF is ingested in a fresh subprocess (parse, sections, anchors, segments, and the
one-transaction add to a fresh store), so its peak RSS (getrusage ru_maxrss) is its own;
the RSS after imports alone is reported beside it.

    .venv/bin/python bench/ingest.py [--out bench/results/ingest.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one(path: Path) -> dict:
    """Runs in the child: ingest one file into a fresh store and measure it."""
    from docqa.app.store import Store
    from docqa.pipelines.ingest.build import build
    from docqa.pipelines.ingest.record import make_record
    from docqa.pipelines.ingest.source import load

    base = _rss_mib()
    t0 = time.perf_counter()
    source = load(path)
    doc = build(source)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "b.db") as store:
        store.add_record(make_record(doc))  # passages, titles, index text, and the write
        t2 = time.perf_counter()
        db_bytes = sum(f.stat().st_size for f in Path(tmp).iterdir())
    return {"file": str(path.relative_to(CORPUS)), "pages": len(doc.pages),
            "sections": len(doc.sections), "anchors": len(doc.anchors),
            "segments": len(doc.segments), "parse_s": t1 - t0, "store_s": t2 - t1,
            "rss_import_mib": base, "rss_peak_mib": _rss_mib(), "db_mib": db_bytes / 2**20}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ingest.md")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    pdfs = sorted(CORPUS.rglob("*.pdf"))
    rows = []
    for pdf in pdfs:
        out = subprocess.run([sys.executable, __file__, "--one", str(pdf)], check=True,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['file']}: {r['pages']} pages in {r['parse_s'] + r['store_s']:.1f} s", flush=True)
    lines = [
        "# Ingest speed and memory (corpus PDFs)",
        "",
        "Command: `.venv/bin/python bench/ingest.py`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs visible (shared with other "
        f"work), Python {platform.python_version()}. Each file in a fresh process; "
        "time = load + parse + sections + anchors + segments (parse) and the single-"
        "transaction store add with both FTS tokenizers (store).",
        "",
        "| file | pages | sections | anchors | segments | parse s | store s | pages/s | "
        "RSS after imports MiB | peak RSS MiB | db MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        total = r["parse_s"] + r["store_s"]
        lines.append(
            f"| {r['file']} | {r['pages']} | {r['sections']} | {r['anchors']} | {r['segments']} "
            f"| {r['parse_s']:.2f} | {r['store_s']:.2f} | {r['pages'] / total:.1f} "
            f"| {r['rss_import_mib']:.0f} | {r['rss_peak_mib']:.0f} | {r['db_mib']:.1f} |"
        )
    pages = sum(r["pages"] for r in rows)
    secs = sum(r["parse_s"] + r["store_s"] for r in rows)
    lines.append(
        f"| **total** | {pages} | | | | {sum(r['parse_s'] for r in rows):.2f} "
        f"| {sum(r['store_s'] for r in rows):.2f} | {pages / secs:.1f} | "
        f"| {max(r['rss_peak_mib'] for r in rows):.0f} (max) | |"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
