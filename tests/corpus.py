"""Where the shared corpus is, and cut-down corpus documents for fast structure tests."""

from __future__ import annotations

from pathlib import Path

from pypdf import PdfReader, PdfWriter

from docqa.pipelines.document import Document, assemble
from docqa.pipelines.ingest.pdf import parse_pdf

CORPUS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus").resolve()
ARRAY = CORPUS / "pdf/contract_ArrayBioPharma_Ono_License_Development_Commercialization_Agreement.pdf"
GOOSEHEAD = CORPUS / "pdf/contract_GooseheadInsurance_Franchise_Agreement.pdf"
IBM = CORPUS / "pdf/contract_IBM_MSL_Outsourcing_Agreement.pdf"
PAPER = CORPUS / "pdf/paper_arXiv_2307.03172_Lost_in_the_Middle.pdf"
RISCV = CORPUS / "pdf/spec_RISCV_Privileged_Architecture_20211203.pdf"
CIVIL_CODE = CORPUS / "zh/zh_PRC_Civil_Code_2020.pdf"
GOLD = CORPUS / "qa/cuad_gold_subset_3contracts.jsonl"


def first_pages_doc(path: Path, n: int, tmp: Path, *, sections: bool = False, anchors: bool = False) -> Document:
    """The first n pages of a corpus PDF (cut with pypdf, so page numbers are unchanged)."""
    from docqa.pipelines.ingest.anchors import tag_anchors
    from docqa.pipelines.ingest.sections import detect_sections

    writer = PdfWriter()
    for page in PdfReader(path).pages[:n]:
        writer.add_page(page)
    cut = tmp / f"{path.stem}_1-{n}.pdf"
    with open(cut, "wb") as f:
        writer.write(f)
    raw, meta = parse_pdf(cut)
    doc = assemble(raw, doc_id="t", content_sha256="t", path=str(cut), type="pdf", metadata=meta)
    if sections or anchors:
        doc.sections = detect_sections(doc)
    if anchors:
        doc.anchors = tag_anchors(doc)
    return doc
