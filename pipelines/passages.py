"""Passages: the retrieval and citation unit — a few consecutive lines of one page.

Segments (~2048 tokens) are what the engine reads; passages (~a paragraph) are what search
ranks and what evidence cites. A passage never crosses a page (or an HTML section), so it
always has one `[PAGE:p, LINE:a-b]` label. Repeated headers/footers are left out: they
match every query and prove nothing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .document import Document

TARGET_CHARS = 400  # about a paragraph; long enough for bm25, short enough to cite
MAX_CHARS = 1000


class Passage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc_id: str
    index: int
    page: int
    label: str | None  # HTML element id
    line_start: int
    line_end: int
    char_start: int
    char_end: int
    text: str
    section_id: str | None = None
    score: float = 0.0  # filled in by retrieval

    def cite_label(self, *, with_doc: bool = False) -> str:
        doc = f"DOC:{self.doc_id}, " if with_doc else ""
        where = f"SECTION:{self.label}" if self.label else f"PAGE:{self.page}"
        return f"[{doc}{where}, LINE:{self.line_start}-{self.line_end}]"


def _ends_paragraph(text: str) -> bool:
    t = text.rstrip()
    return t.endswith((".", ":", ";", "。", "；", "：")) or not t


def make_passages(doc: Document) -> list[Passage]:
    out: list[Passage] = []
    sec_starts = [(s.char_start, s.id) for s in doc.sections]
    heading_at = {s.char_start for s in doc.sections}
    for page in doc.pages:
        body = [ln for ln in page.lines if ln.role == "body" and ln.text.strip()]
        group: list = []
        size = 0

        def flush():
            nonlocal group, size
            if group:
                a, b = group[0], group[-1]
                sid = None
                for start, s_id in sec_starts:
                    if start <= a.start:
                        sid = s_id
                    else:
                        break
                out.append(
                    Passage(
                        doc_id=doc.doc_id,
                        index=len(out),
                        page=page.n,
                        label=page.label,
                        line_start=a.n,
                        line_end=b.n,
                        char_start=a.start,
                        char_end=b.end,
                        text=doc.text[a.start : b.end],
                        section_id=sid,
                    )
                )
            group, size = [], 0

        prev_n = None
        for ln in body:
            # A blank line (or a header) between two lines is a paragraph break.
            gap = prev_n is not None and ln.n != prev_n + 1
            # A clause heading always starts a passage, so evidence is cited clause by clause.
            if group and (ln.start in heading_at or size >= MAX_CHARS
                          or (size >= TARGET_CHARS and (gap or _ends_paragraph(group[-1].text)))):
                flush()
            group.append(ln)
            size += len(ln.text) + 1
            prev_n = ln.n
        flush()
    return out
