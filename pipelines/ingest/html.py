"""HTML and XHTML -> one unit of lines per heading, each labelled with its element id.

Safety. The bytes go to libxml2 through lxml with no network, no DTD loading, no entity
resolution and the default size limits (`huge_tree` off). XHTML (an XML declaration or the
XHTML namespace on the root) is read with the XML parser so that `<x/>` and CDATA mean what
they say; if that parser rejects the file it is read again as HTML, except when libxml2
stopped it for entity amplification (a billion-laughs file), which is refused outright.
An entity reference is never replaced by anything: its name is recorded in the metadata.

Units and element ids. Every h1-h6 starts a unit; the text before the first heading is a
unit of its own when it has any text. A unit's first line is its heading, e.g.
"15.5.5. 404 Not Found", and its label (the citation target) is, in this order:
the heading's own id; the id of the nearest ancestor that begins with the heading (an
enclosing `<section id>` or `<div id>`); an `<a id>`/`<a name>` inside the heading; else None.
RFC 9110 as published by httpwg.org has `<section id="status.404"><h4 id="rfc.section.15.5.5">`,
so §15.5.5 is labelled "rfc.section.15.5.5", the anchor its own table of contents links to.

Line rule. A paragraph-like block (p, li, dt, dd, div text, ...) is one line when it fits in
`LINE_WIDTH` characters; a longer one is cut into the longest runs of whole sentences that
fit, and a sentence longer than that is wrapped at the last space that fits. Words are
never split (a single longer word is a line of its own). Whitespace inside a block is
collapsed to single spaces. `<br>` ends a line. List items start with "- " (or "N. " in an
ordered list), indented two spaces per nesting level. A table is a Markdown table, one line
per row however long (a caption line first), with a "| --- |" line after the first row.
`<pre>` keeps its lines exactly, blank lines included (only blank lines at its two ends
go).

Removed: head, script, style, noscript, template, forms and their controls, embedded
objects and SVG, comments, `<nav>`, anything with role navigation/banner/contentinfo/search,
a table of contents (class "toc" or an id ending in "toc"), anything `hidden`, and
`<header>`/`<footer>` outside an article, section or main region. Nothing else is cut on a
guess: Bikeshed specs keep their abstract outside `<main>`, so "read only <main>" would lose it.
"""

from __future__ import annotations

import re

from lxml import etree

from ..document import RawLine, RawPage, RawSection
from ..errors import IngestError
from .text import decode, heading_number, read_bytes

LINE_WIDTH = 200

_DROP_TAGS = frozenset(
    "head script style noscript template nav form button input select textarea option "
    "optgroup datalist iframe frame frameset object embed applet svg canvas audio video "
    "source track map area link meta title base".split()
)
_DROP_ROLES = frozenset({"navigation", "banner", "contentinfo", "search"})
_HEADINGS = {f"h{i}": i for i in range(1, 7)}
_BLOCKS = frozenset(
    "html body main article section header footer aside div p blockquote address figure "
    "figcaption details summary ul ol dl dt dd li hr fieldset legend center caption "
    "tbody thead tfoot tr td th dialog hgroup".split()
)
_TOC_ID = re.compile(r"(^|[._-])toc$", re.IGNORECASE)
# A sentence ends at ".", "!" or "?" followed by a space and no lowercase word ("e.g. the"
# goes on), or at ";" / ":" followed by a space.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?![a-z])|(?<=[;:])\s+")
_MIN_FILL = 0.4
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*encoding\s*=\s*["']([A-Za-z0-9_.:-]+)""")
_XHTML = re.compile(rb"""<html[^>]*xmlns\s*=\s*["']http://www\.w3\.org/1999/xhtml""", re.IGNORECASE)
# WHATWG: these labels mean windows-1252 in HTML (cp1252 leaves five bytes undefined,
# latin-1 then catches them).
_LATIN = {"us-ascii", "ascii", "iso-8859-1", "iso8859-1", "latin1", "latin-1", "windows-1252", "cp1252"}


def _local(tag) -> str | None:
    if not isinstance(tag, str):
        return None  # comment, processing instruction or entity reference
    return tag.rpartition("}")[2].lower()


def _classes(el) -> set[str]:
    return set((el.get("class") or "").lower().split())


def _collapse(text: str) -> str:
    return " ".join(text.replace("\ufeff", "").split())


def wrap(text: str, width: int = LINE_WIDTH) -> list[str]:
    """Cut a collapsed paragraph into lines of at most `width` characters: at the last
    sentence end that leaves the line at least `_MIN_FILL` full, else at the last space;
    a word longer than `width` is a line of its own, never split."""
    lines: list[str] = []
    while len(text) > width:
        window = text[: width + 1]
        cut = None
        for m in _SENTENCE_END.finditer(window):
            if m.start() >= width * _MIN_FILL:
                cut = (m.start(), m.end())
        if cut is None:
            space = window.rfind(" ")
            if space <= 0:
                space = text.find(" ", width)
                if space < 0:
                    break
            cut = (space, space + 1)
        lines.append(text[: cut[0]])
        text = text[cut[1] :]
    if text:
        lines.append(text)
    return lines


class _Unit:
    def __init__(self, label: str | None):
        self.label = label
        self.lines: list[str] = []


class _Walker:
    """Walks the tree in document order with an explicit stack (deep trees cannot exhaust
    Python's recursion limit) and lays text out into units of lines."""

    def __init__(self, root):
        self.units: list[_Unit] = [_Unit(None)]
        self.sections: list[tuple[RawSection, int]] = []  # (section, index into self.units)
        self.buf: list[str] = []
        self.prefix = ""  # list marker waiting for the item's first text
        self.lists: list[list] = []  # per open list: [ordered, next number]
        self.entities: list[str] = []
        self.root = root

    # -- what is dropped ---------------------------------------------------------------
    def dropped(self, el, tag: str) -> bool:
        if tag in _DROP_TAGS:
            return True
        if (el.get("role") or "").lower() in _DROP_ROLES:
            return True
        if el.get("hidden") is not None or "hidden" in _classes(el):
            return True
        if "toc" in _classes(el) or _TOC_ID.search(el.get("id") or ""):
            return True
        if tag in ("header", "footer"):
            return not any(_local(a.tag) in ("article", "section", "main") or (a.get("role") or "") == "main"
                           for a in el.iterancestors())
        return False

    # -- output --------------------------------------------------------------------------
    def flush(self) -> None:
        text = _collapse("".join(self.buf))
        self.buf = []
        if not text:
            return
        if self.prefix:
            text = self.prefix + text
            self.prefix = ""
        self.units[-1].lines.extend(wrap(text))

    def add_text(self, text: str | None) -> None:
        if text:
            self.buf.append(text)

    # -- the walk ------------------------------------------------------------------------
    def run(self) -> None:
        stack = [iter(self.root)]
        open_els = [self.root]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                el = open_els.pop()
                self.end(el, _local(el.tag))
                if stack:
                    self.add_text(el.tail)
                continue
            tag = _local(child.tag)
            if tag is None:
                if isinstance(child, etree._Entity):
                    self.entities.append(child.name)
                self.add_text(child.tail)
                continue
            if self.dropped(child, tag):
                self.add_text(child.tail)
                continue
            if tag in _HEADINGS or tag in ("table", "pre"):
                self.flush()
                if tag in _HEADINGS:
                    self.heading(child, tag)
                elif tag == "table":
                    self.table(child)
                else:
                    self.pre(child)
                self.add_text(child.tail)
                continue
            self.start(child, tag)
            self.add_text(child.text)
            open_els.append(child)
            stack.append(iter(child))
        self.flush()

    def start(self, el, tag: str) -> None:
        if tag == "br":
            self.flush()
        elif tag in _BLOCKS:
            self.flush()
            if tag in ("ul", "ol"):
                start = el.get("start") or "1"
                self.lists.append([tag == "ol", int(start) if start.isdigit() else 1])
            elif tag == "li":
                indent = "  " * max(0, len(self.lists) - 1)
                if self.lists and self.lists[-1][0]:
                    self.prefix = f"{indent}{self.lists[-1][1]}. "
                    self.lists[-1][1] += 1
                else:
                    self.prefix = f"{indent}- "

    def end(self, el, tag: str | None) -> None:
        if tag in _BLOCKS:
            self.flush()
            if tag in ("ul", "ol") and self.lists:
                self.lists.pop()
            if tag == "li":
                self.prefix = ""

    # -- structures read whole ------------------------------------------------------------
    def inline_text(self, el, *, keep_breaks: bool = False) -> str:
        """The text of `el` without dropped parts; `<br>` is a newline when `keep_breaks`."""
        out: list[str] = [el.text or ""]
        stack = [iter(el)]
        open_els = [el]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                done = open_els.pop()
                if stack:
                    out.append(done.tail or "")
                continue
            tag = _local(child.tag)
            if tag is None or self.dropped(child, tag):
                if isinstance(child, etree._Entity):
                    self.entities.append(child.name)
                out.append(child.tail or "")
                continue
            if tag == "br" or (not keep_breaks and tag in _BLOCKS):
                out.append("\n" if keep_breaks else " ")
            out.append(child.text or "")
            open_els.append(child)
            stack.append(iter(child))
        return "".join(out)

    def heading(self, el, tag: str) -> None:
        text = _collapse(self.inline_text(el))
        if not text:
            return
        number = el.get("data-level") or None
        parsed, title = heading_number(text)
        if number is None:
            number = parsed
        elif parsed == number:
            pass
        else:
            title = text
        label = _element_id(el)
        self.units.append(_Unit(label))
        self.units[-1].lines.extend(wrap(text))
        section = RawSection(number=number, title=title, level=_HEADINGS[tag], page=0, element_id=label)
        self.sections.append((section, len(self.units) - 1))

    def table(self, el) -> None:
        caption = next((c for c in el if _local(c.tag) == "caption"), None)
        if caption is not None:
            self.units[-1].lines.extend(wrap(_collapse(self.inline_text(caption))))
        rows: list[list[str]] = []
        for tr in el.iter("{*}tr", "tr"):
            if next((a for a in tr.iterancestors() if _local(a.tag) == "table"), None) is not el:
                continue  # a nested table's row: its text is already in the outer cell
            cells: list[str] = []
            for cell in tr:
                if _local(cell.tag) not in ("td", "th") or self.dropped(cell, "td"):
                    continue
                cells.append(_collapse(self.inline_text(cell)).replace("|", "\\|"))
                span = cell.get("colspan") or "1"
                cells.extend([""] * (min(int(span), 100) - 1 if span.isdigit() else 0))
            if cells:
                rows.append(cells)
        if not rows:
            return
        width = max(len(r) for r in rows)
        lines = []
        for i, r in enumerate(rows):
            r = r + [""] * (width - len(r))
            lines.append("| " + " | ".join(r) + " |")
            if i == 0:
                lines.append("|" + " --- |" * width)
        self.units[-1].lines.extend(lines)

    def pre(self, el) -> None:
        lines = self.inline_text(el, keep_breaks=True).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        self.units[-1].lines.extend(lines)


def _element_id(heading) -> str | None:
    if heading.get("id"):
        return heading.get("id")
    el = heading
    parent = el.getparent()
    while parent is not None:
        first = next((c for c in parent if isinstance(c.tag, str)), None)
        if first is not el or (parent.text or "").strip():
            break
        if parent.get("id"):
            return parent.get("id")
        el, parent = parent, parent.getparent()
    for a in heading.iter("{*}a", "a"):
        if a.get("id") or a.get("name"):
            return a.get("id") or a.get("name")
    return None


def _sniff(data: bytes) -> tuple[str | None, bool]:
    """(declared encoding, whether to read as XML) from the first bytes."""
    head = data[:4096]
    m = _XML_ENCODING.match(head) or _CHARSET.search(head)
    declared = m.group(1).decode("ascii").lower() if m else None
    if declared in _LATIN:
        declared = "cp1252"
    is_xml = head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<?xml") or bool(_XHTML.search(head))
    return declared, is_xml


def _parse_tree(path, data: bytes):
    declared, is_xml = _sniff(data)
    text, encoding = decode(path, data, declared)
    utf8 = text.encode("utf-8")
    if is_xml:
        parser = etree.XMLParser(
            encoding="utf-8", resolve_entities=False, no_network=True, load_dtd=False,
            dtd_validation=False, huge_tree=False, remove_comments=True, remove_pis=True,
        )
        try:
            root = etree.fromstring(utf8, parser)
            return root, encoding, "xml"
        except etree.XMLSyntaxError as e:
            reason = str(e).lower()
            if "amplification" in reason or ("entity" in reason and "loop" in reason):
                raise IngestError(str(path), "refused: entity expansion limit exceeded (entities are never resolved)") from e
    parser = etree.HTMLParser(encoding="utf-8", no_network=True, huge_tree=False, remove_comments=True, remove_pis=True)
    try:
        root = etree.fromstring(utf8, parser)
    except (etree.XMLSyntaxError, etree.ParserError) as e:
        raise IngestError(str(path), f"not parseable as HTML ({e})") from e
    if root is None:
        raise IngestError(str(path), "no HTML content (empty document)")
    return root, encoding, "html"


def _metadata(root, parser: str, encoding: str) -> dict:
    meta: dict = {"parser": parser, "encoding": encoding}
    title = next((t for t in root.iter("{*}title", "title")), None)
    if title is not None and _collapse(title.xpath("string()")):
        meta["title"] = _collapse(title.xpath("string()"))
    if root.get("lang"):
        meta["lang"] = root.get("lang")
    authors: list[str] = []
    for m in root.iter("{*}meta", "meta"):
        name = (m.get("name") or "").lower()
        content = _collapse(m.get("content") or "")
        if not name or not content:
            continue
        if name in ("dcterms.creator", "author", "dc.creator"):
            authors.append(content)
        elif name in ("description", "dcterms.abstract") and "description" not in meta:
            meta["description"] = content
        elif name in ("keywords", "generator"):
            meta[name] = content
        elif name in ("dcterms.issued", "dcterms.date", "date"):
            meta.setdefault("date", content)
        elif name == "dcterms.identifier":
            rfc = re.fullmatch(r"urn:ietf:rfc:(\d+)", content)
            if rfc:
                meta["rfc"] = int(rfc.group(1))
    if authors:
        meta["authors"] = authors
    return meta


def _unique_labels(units) -> list[str]:
    """Every unit needs a label citations can name. A unit with no id of its own takes
    "top" (which browsers resolve to the top of the page) before any id, else the previous
    id with "~k"; a repeated id gets "~k" too. Links drop the "~k" (see `link_target`)."""
    out, seen, prev, k = [], set(), "top", 0
    for u in units:
        if u.label and u.label not in seen:
            prev, k = u.label, 0
            label = u.label
        else:
            k += 1
            label = prev if (prev == "top" and k == 1 and "top" not in seen) else f"{prev}~{k}"
        seen.add(label)
        out.append(label)
    return out


def link_target(label: str) -> str:
    """The element id to link to for a unit label (the part before any "~k")."""
    return label.split("~", 1)[0]


def parse_html(path, data: bytes | None = None) -> tuple[list[RawPage], list[RawSection], dict]:
    """Parse an HTML or XHTML file into (units, sections, metadata).

    Each unit is a `RawPage` labelled with its heading's element id (see the module
    docstring for the id, line and removal rules); `RawSection.page` is the 1-based unit
    whose first line is the heading. Metadata: title, parser ("html"/"xml"), encoding, and
    where present lang, description, keywords, generator, date, authors, rfc.
    Raises `IngestError` for binary or undecodable bytes, refused entity expansion, and
    documents without text.
    """
    raw = read_bytes(path, data)
    root, encoding, parser = _parse_tree(path, raw)
    body = next(iter(root.iter("{*}body", "body")), None)
    walker = _Walker(body if body is not None else root)
    walker.run()

    units = [u for u in walker.units if u.lines or u is not walker.units[0]]
    offset = 0 if walker.units[0].lines else 1
    pages = [RawPage(lines=[RawLine(text=t) for t in u.lines], label=lbl) for u, lbl in zip(units, _unique_labels(units))]
    if not any(p.lines for p in pages):
        raise IngestError(str(path), "no text content in the HTML")
    sections = _levelled([(s, s.level, i + 1 - offset) for s, i in walker.sections])
    meta = _metadata(root, parser, encoding)
    if "title" not in meta:
        first = next((s for s in sections if s.level == 1), None)
        if first is not None:
            meta["title"] = first.title
    if "rfc" not in meta:
        front = "\n".join(ln.text for ln in pages[0].lines[:20])
        m = re.search(r"\bRequest for Comments:\s*(\d+)", front)
        if m:
            meta["rfc"] = int(m.group(1))
    if walker.entities:
        meta["unresolved_entities"] = sorted(set(walker.entities))
    return pages, sections, meta


def _levelled(found: list[tuple[RawSection, int, int]]) -> list[RawSection]:
    """Set each section's level and unit. A dotted number decides the level ("4.1.2" is 3);
    otherwise the tag does, shifted by how far the document's tags sit from its numbers
    (RFC 9110 puts §1 in an h2). When every heading uses the same tag, tags carry no depth
    (RFC 8446 uses h1 throughout) and unnumbered headings are level 1."""
    numbered = [(s.number.count(".") + 1, tag) for s, tag, _ in found if s.number]
    same_tag = len({tag for _, tag, _ in found}) <= 1
    shifts = [tag - depth for depth, tag in numbered]
    shift = max(set(shifts), key=shifts.count) if shifts else min((t for _, t, _ in found), default=1) - 1
    out = []
    for s, tag, unit in found:
        if s.number:
            level = s.number.count(".") + 1
        elif same_tag:
            level = 1
        else:
            level = max(1, tag - shift)
        out.append(s.model_copy(update={"level": level, "page": unit}))
    return out
