"""OCR of low-resolution scans: a page scanned at 72, 100 and 200 dpi, read as docqa read it
before (drawn at 300 dpi, the script detector asked first) and as it reads it now (drawn at
twice the scan's resolution, at most 300; the detector asked only when the English reading's
confidence is under `ocr.CONFIDENT`). Per case: the detector's script, the mean word
confidence, whether the page is kept, and the share of the text layer's words the reading has.

    .venv/bin/python bench/ocr_resolution.py [--out bench/results/ocr_resolution.md]

Pages: one of each of two tune and two held-out contracts (bench/corpus_split.py), and a page
of the PRC Civil Code, which must be refused (no Chinese language data installed).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path

import pypdfium2 as pdfium

from docqa.pipelines.ingest import ocr
from docqa.pipelines.ingest.pdf import parse_pdf

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
PAGES = [  # (file, 0-based page)
    ("pdf/contract_IBM_MSL_Outsourcing_Agreement.pdf", 0),
    ("pdf/contract_GooseheadInsurance_Franchise_Agreement.pdf", 20),
    ("pdf/contract_KINGPHARMACEUTICALSINC_08_09_2006_EX_10_1_PROMOTION_AGREEMENT.pdf", 3),
    ("pdf/contract_Quaker_Chemical_Corporation_NON_COMPETITION_AND_NON_SOLICITATION_AGREEMENT.pdf", 1),
    ("zh/zh_PRC_Civil_Code_2020.pdf", 10),
]
SCANS = (72, 100, 200)


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 1}


def read(tess, page, dpi: int, *, before: bool) -> tuple[str, float, bool, str]:
    """(script, confidence, kept, text) of one page read at `dpi`, under the old or new rule."""
    bitmap = page.render(scale=dpi / 72, grayscale=True)
    image = (bytes(bitmap.buffer), bitmap.width, bitmap.height, bitmap.stride, dpi)
    lines, conf = tess.read(image)
    tess.osd.SetImageBytes(*image[:3], 1, image[3])
    tess.osd.SetSourceResolution(dpi)
    found = tess.osd.DetectOrientationScript() or {"script_name": "-", "script_conf": 0.0}
    foreign = found["script_name"] not in ocr.SCRIPTS and found["script_conf"] >= ocr.SCRIPT_CONF
    kept = not foreign if before else (conf >= ocr.CONFIDENT or not foreign)
    return f"{found['script_name']} {found['script_conf']:.1f}", conf, kept and bool(lines), "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from corpus_split import part

    rows, t0 = [], time.time()
    with ocr._Tesseract() as tess:
        for name, index in PAGES:
            data = (CORPUS / name).read_bytes()
            layer, _ = parse_pdf(CORPUS / name)
            want = words(" ".join(ln.text for ln in layer[index].lines))
            try:
                which = part(Path(name).name)
            except ValueError:
                which = "—"
            for scan_dpi in SCANS:
                pdf = pdfium.PdfDocument(ocr.image_pdf([ocr.render_grey(data, index, scan_dpi)], dpi=scan_dpi))
                page = pdf[0]
                for label, dpi, before in (("before", ocr.DPI, True), ("now", ocr.render_dpi(page), False)):
                    script, conf, kept, text = read(tess, page, dpi, before=before)
                    recall = len(words(text) & want) / max(len(want), 1) if kept else 0.0
                    rows.append((Path(name).stem[:40], index + 1, which, scan_dpi, label, dpi, script, conf,
                                 "kept" if kept else "refused", recall))
                    print(*rows[-1], flush=True)
                pdf.close()
    lines = [
        "# OCR of low-resolution scans: render resolution and the script check",
        "",
        "Command: `.venv/bin/python bench/ocr_resolution.py --out bench/results/ocr_resolution.md`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared; load average at the end "
        f"{os.getloadavg()[0]:.1f}); {time.time() - t0:.0f} s in all. `before`: drawn at {ocr.DPI} dpi, a page "
        f"refused when the script detector names a script other than Latin with confidence >= {ocr.SCRIPT_CONF}. "
        f"`now`: drawn at twice the scan's resolution (at most {ocr.DPI}), the detector asked only when the "
        f"mean word confidence is under {ocr.CONFIDENT}. Words: the share of the text layer's words (2+ "
        "letters) the reading has (0 when refused). The Civil Code must be refused: there is no Chinese "
        "language data.",
        "",
        "| page | part | scan dpi | rule | drawn at dpi | detector | mean confidence | page | words |",
        "| --- | --- | ---: | --- | ---: | --- | ---: | --- | ---: |",
        *[f"| {n} p. {p} | {w} | {s} | {lab} | {d} | {sc} | {c:.0f} | {k} | {r:.2f} |"
          for n, p, w, s, lab, d, sc, c, k, r in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
