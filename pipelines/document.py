"""The doc_structure: one document's text with exact page/line provenance.

Every parser (PDF, HTML, text) produces a list of `RawPage`s; `assemble()` turns them
into a `Document` whose `text` is the concatenation of all lines. Offsets everywhere
(sections, anchors, segments) are character offsets into `Document.text`, and
`Document.locate()` is the one place that maps an offset back to (page, line).

Layout of `Document.text`: the lines of a page joined by "\\n"; pages joined by "\\f"
(a blank page contributes an empty string, so two "\\f" follow each other).
For HTML, a "page" is the text of one section, labelled with its element id; citations
for HTML use the label instead of a page number.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, model_serializer, model_validator

DocType = Literal["pdf", "html", "markdown", "text"]
LineRole = Literal["body", "header", "footer"]
AnchorType = Literal["ENTITY", "DEFINITION", "CLAUSE", "LOGIC", "TOPIC", "PAPER"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawLine(Strict):
    text: str
    role: LineRole = "body"


class RawPage(Strict):
    """A parser's output for one page (PDF), one section body (HTML) or one file chunk."""

    lines: list[RawLine]
    label: str | None = None  # HTML element id of the section this unit belongs to


class RawSection(Strict):
    """A section a parser knows structurally (HTML headings); PDFs and text get theirs
    from `pipelines/ingest/sections.py`. `page` is the 1-based index of the unit whose first line is
    the heading."""

    number: str | None
    title: str
    level: int
    page: int
    element_id: str | None = None


class Line(Strict):
    n: int  # 1-based within its page; what citations use
    text: str  # exactly what `docqa show --page` displays
    start: int  # char offset of the line in Document.text
    end: int
    role: LineRole = "body"


class Page(Strict):
    n: int  # 1-based physical page (PDF) or unit index (HTML/text)
    label: str | None = None
    start: int
    end: int
    lines: list[Line]


class Location(Strict):
    page: int
    line: int
    label: str | None = None


class Span(Strict):
    """Where something lies in its document: the one provenance that sections, chunks,
    passages, anchors, citations and search hits all hold (their `span`), and the one
    place a `[PAGE:…, LINE:…]` label is written.

    `page` is the 1-based page (PDF, text) or unit (HTML) where it starts and `page_end`
    where it ends; `element_id` the HTML element id that HTML citations name instead of a
    page; lines are 1-based within their page; chars are offsets into `Document.text`.
    """

    page: int | None = None
    page_end: int | None = None  # None: the same page
    element_id: str | None = None
    line_start: int
    line_end: int
    char_start: int | None = None
    char_end: int | None = None

    def label(self, doc_id: str | None = None, *, line_range: bool = False) -> str:
        """`[PAGE:p, LINE:a-b]`, `[SECTION:element-id, LINE:a-b]` for HTML, with `DOC:id, `
        first when `doc_id` is given (answers over several documents). One line is written
        `LINE:a`, or `LINE:a-a` with `line_range` (how passages have always been shown to
        the model: prompts stay as they were). A span over pages names both ends."""
        doc = f"DOC:{doc_id}, " if doc_id is not None else ""
        where = f"SECTION:{self.element_id}" if self.element_id else f"PAGE:{self.page}"
        if self.page_end is not None and self.page_end != self.page and not self.element_id:
            return f"[{doc}{where}, LINE:{self.line_start}]-[PAGE:{self.page_end}, LINE:{self.line_end}]"
        one = self.line_start == self.line_end and not line_range
        lines = f"{self.line_start}" if one else f"{self.line_start}-{self.line_end}"
        return f"[{doc}{where}, LINE:{lines}]"


class Spanned(Strict):
    """A structure that holds its provenance as one `span`.

    Its *flat form* puts the span's fields beside its own, under the names in `_FLAT`
    (flat name -> Span field; "line" of an anchor is both ends), in the key order of
    `_ORDER`: the shape these structures had before they held a Span, so stored rows, the
    runs table's JSON, `--json` output and old stored runs read and write as they always
    did. Built from either form; `model_dump`/`model_dump_json` write the flat one.
    """

    span: Span
    _FLAT: ClassVar[dict[str, str]]
    _ORDER: ClassVar[tuple[str, ...]]

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "span" in data:
            return data
        data, span = dict(data), {}
        for name, field in cls._FLAT.items():
            if name in data:
                value = data.pop(name)
                if field == "line":
                    span["line_start"] = span["line_end"] = value
                else:
                    span[field] = value
        return data | {"span": span}

    @model_serializer(mode="wrap")
    def _to_flat(self, handler, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        span = out.pop("span", None)
        if span is not None:
            for name, field in self._FLAT.items():
                out[name] = span["line_start" if field == "line" else field]
        # model_dump(include=/exclude=) name flat keys, as they did before the span.
        return {k: out[k] for k in self._ORDER if k in out and (not info.include or k in info.include)
                and not (info.exclude and k in info.exclude)}


class Section(Spanned):
    """A heading and the text under it to the next heading of its level or above: its span
    runs from the heading's line (`page`) to the section's last line (`page_end`);
    `span.element_id` is the HTML element id its citations name."""

    id: str  # stable within the document: "s1", "s2", ... in reading order
    number: str | None  # "5.2.1", "ARTICLE 7", "Exhibit B", "第一百四十三条"
    title: str
    level: int  # 1 = top
    parent_id: str | None = None

    _FLAT = {"char_start": "char_start", "char_end": "char_end", "page_start": "page", "line_start": "line_start",
             "page_end": "page_end", "line_end": "line_end", "element_id": "element_id"}
    _ORDER = ("id", "number", "title", "level", "parent_id", "char_start", "char_end", "page_start",
              "line_start", "page_end", "line_end", "element_id")


class Anchor(Spanned):
    """A typed mention (entity, definition, clause reference, ...); its span is the one line
    where it starts (`line_start == line_end`) and its chars."""

    type: AnchorType
    text: str  # as it appears in the document
    value: str  # normalised (ISO date, amount in a canonical form, resolved section id, ...)
    subtype: str | None = None  # e.g. ORG, MONEY, DATE, PERCENT, DURATION for ENTITY
    section_id: str | None = None  # the section the anchor lies in
    target_section_id: str | None = None  # CLAUSE: the section it points at, when found

    _FLAT = {"char_start": "char_start", "char_end": "char_end", "page": "page", "line": "line"}
    _ORDER = ("type", "text", "value", "subtype", "char_start", "char_end", "page", "line", "section_id",
              "target_section_id")


class Chunk(Spanned):
    """About `segment_tokens` tokens of consecutive lines (`ingest.chunks`): the unit the
    map-reduce and summary steps read, stored in the `segments` table and counted as
    "segments" by the CLI. Not the engine's `Segment`, a block of KV cache."""

    index: int
    token_count: int
    text: str

    _FLAT = {"char_start": "char_start", "char_end": "char_end", "page_start": "page", "line_start": "line_start",
             "page_end": "page_end", "line_end": "line_end"}
    _ORDER = ("index", "char_start", "char_end", "page_start", "line_start", "page_end", "line_end",
              "token_count", "text")


class Passage(Spanned):
    """The retrieval and citation unit: a few consecutive lines of one page (made by
    `pipelines.ingest.passages`); `span.element_id` is, for HTML, the element id its
    citations name (the page's label)."""

    doc_id: str
    index: int
    text: str
    section_id: str | None = None  # the "s1" id of the section it lies in
    score: float = 0.0  # filled in by retrieval

    _FLAT = {"page": "page", "element_id": "element_id", "line_start": "line_start", "line_end": "line_end",
             "char_start": "char_start", "char_end": "char_end"}
    _ORDER = ("doc_id", "index", "page", "element_id", "line_start", "line_end", "char_start", "char_end",
              "text", "section_id", "score")

    def cite_label(self, *, with_doc: bool = False) -> str:
        return self.span.label(self.doc_id if with_doc else None, line_range=True)


class Document(Strict):
    doc_id: str  # short content hash
    content_sha256: str
    path: str
    type: DocType
    title: str | None = None
    text: str
    pages: list[Page]
    sections: list[Section] = Field(default_factory=list)
    anchors: list[Anchor] = Field(default_factory=list)
    segments: list[Chunk] = Field(default_factory=list)
    metadata: dict[str, str | int | float | bool | None | list[str]] = Field(default_factory=dict)

    def _line_starts(self) -> tuple[list[int], list[tuple[int, int]]]:
        cache = self.__dict__.get("_line_index")
        if cache is None:
            starts, where = [], []
            for p in self.pages:
                for ln in p.lines:
                    starts.append(ln.start)
                    where.append((p.n, ln.n))
            cache = (starts, where)
            self.__dict__["_line_index"] = cache
        return cache

    def locate(self, offset: int) -> Location:
        """The page and line holding char `offset` (a separator maps to the line before it)."""
        starts, where = self._line_starts()
        if not starts:
            return Location(page=1, line=0)
        i = max(0, bisect.bisect_right(starts, offset) - 1)
        page, line = where[i]
        return Location(page=page, line=line, label=self.pages[page - 1].label)

    def page(self, n: int) -> Page:
        if not 1 <= n <= len(self.pages):
            raise IndexError(f"page {n} out of range 1..{len(self.pages)}")
        return self.pages[n - 1]

    def lines_text(self, page: int, line_start: int, line_end: int) -> str:
        """The text of lines line_start..line_end (inclusive, 1-based) of a page."""
        lines = self.page(page).lines
        return "\n".join(ln.text for ln in lines[max(0, line_start - 1) : line_end])


def assemble(
    raw_pages: list[RawPage],
    *,
    doc_id: str,
    content_sha256: str,
    path: str,
    type: DocType,
    title: str | None = None,
    metadata: dict | None = None,
) -> Document:
    """Lay the parsers' pages out into one text with exact offsets."""
    parts: list[str] = []
    pages: list[Page] = []
    pos = 0
    for i, raw in enumerate(raw_pages):
        if i:
            parts.append("\f")
            pos += 1
        page_start = pos
        lines = []
        for j, rl in enumerate(raw.lines):
            if j:
                parts.append("\n")
                pos += 1
            text = rl.text.replace("\f", " ").replace("\n", " ")
            lines.append(Line(n=j + 1, text=text, start=pos, end=pos + len(text), role=rl.role))
            parts.append(text)
            pos += len(text)
        pages.append(Page(n=i + 1, label=raw.label, start=page_start, end=pos, lines=lines))
    return Document(
        doc_id=doc_id,
        content_sha256=content_sha256,
        path=path,
        type=type,
        title=title,
        text="".join(parts),
        pages=pages,
        metadata=metadata or {},
    )


class Encoder(Protocol):
    """A sentence encoder, injected (the engine's MiniLM: `engine.models.bert` for passages,
    `bert_numpy` for a question). `name` says which model at which truncation: vectors are
    compared only with vectors of the same name."""

    name: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, each row L2-normalised."""
        ...


@dataclass(frozen=True)
class PassageVectors:
    """One sentence embedding per passage, rows in passage order (n, d), and the name of
    what made them (`ingest.passages.vectors_name`: the encoder and what of a passage it read)."""

    name: str
    matrix: np.ndarray


@dataclass(frozen=True)
class Record:
    """One document ready to store, made by `pipelines.ingest.record` (the store writes it
    as it is). `search_text[(unit, tokenizer)]` has one tuple per row of
    `unit` (pages, segments, passages, in order) with the text of each of its FTS columns:
    (text,), and (text, titles) for passages."""

    document: Document
    passages: list[Passage]
    titles: list[str]  # per passage: its section and the sections above it ("" for none)
    search_text: dict[tuple[str, str], list[tuple[str, ...]]]
    vectors: PassageVectors | None = None  # None: made on first use (`docqa ask`)

    @property
    def doc_id(self) -> str:
        return self.document.doc_id
