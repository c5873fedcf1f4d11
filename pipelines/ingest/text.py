"""Plain text and Markdown files -> pages of lines, with the encoding decided conservatively.

Page rule. A plain text file is split into pages at form feeds ("\\f", how printed text such
as an RFC's .txt marks page breaks); without form feeds the whole file is one page. One page
is deliberate: [PAGE:1, LINE:l] is then line l in the reader's own editor, which an
arbitrary 100-line "page" would not be. Lines are the file's own lines, verbatim (only the
line terminator is removed; "\\r\\n" and a lone "\\r" count as line breaks), never wrapped,
for the same reason.

A Markdown file is split into one unit per heading instead, because a `RawSection` records
the unit whose first line is its heading and nothing finer: the text before the first
heading is unit 1 (when it is not blank), and every heading starts a new unit whose first
line is the heading itself. Lines stay verbatim, so what is shown is what was written.

Encoding rule (never guess into mojibake): a BOM decides (UTF-8, UTF-16, UTF-32); else NUL
bytes mean a binary file; else strict UTF-8; else UTF-8 with its few invalid sequences
replaced, when valid multi-byte characters outnumber them 4:1 (the encoding recorded says
how many); else charset-normalizer, accepted only when it finds the text both free of chaos
and coherent in some language; else `IngestError`.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from ..document import RawLine, RawPage, RawSection
from ..errors import IngestError

NOT_DECODABLE = "not valid UTF-8 and the encoding could not be determined"
BINARY = "binary file, not text"

# Longest BOMs first: the UTF-32-LE BOM begins with the UTF-16-LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# charset-normalizer always names *some* single-byte code page; these bounds are where its
# answer stopped being a guess on our samples (a short "café" came back as Farsi cp1006 with
# coherence 0; real French/German paragraphs come back with coherence 40-60).
_MAX_CHAOS_PERCENT = 10.0
_MIN_COHERENCE_PERCENT = 20.0
# C0 controls other than tab/newline/vt/ff/cr, and the C1 block: real text does not carry them.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


def read_bytes(path, data: bytes | None) -> bytes:
    if data is not None:
        return data
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise IngestError(str(path), f"cannot read file ({e.strerror or e})") from e


def decode(path, data: bytes, declared: str | None = None) -> tuple[str, str]:
    """`data` as text and the encoding used; `declared` (e.g. an HTML meta charset) is tried
    after a BOM and before detection. Raises `IngestError` rather than return mojibake."""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc), enc
            except UnicodeDecodeError as e:
                raise IngestError(str(path), f"invalid {enc} after its byte-order mark ({e.reason})") from e
    if b"\x00" in data:
        raise IngestError(str(path), BINARY)
    if declared:
        try:
            return data.decode(declared), declared
        except (UnicodeDecodeError, LookupError):
            pass  # a wrong declaration is common; fall through to what the bytes say
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    mostly = _mostly_utf8(data)
    if mostly is not None:
        return mostly
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if (
        best is None
        or best.percent_chaos > _MAX_CHAOS_PERCENT
        or best.percent_coherence < _MIN_COHERENCE_PERCENT
    ):
        raise IngestError(str(path), NOT_DECODABLE)
    text = str(best)
    if _CONTROL.search(text):
        raise IngestError(str(path), NOT_DECODABLE)
    return text, best.encoding


def _mostly_utf8(data: bytes) -> tuple[str, str] | None:
    """UTF-8 with a few damaged bytes (a truncated copy, one pasted Latin-1 word) is UTF-8: read
    as a legacy code page instead, every correct non-ASCII character would become mojibake.
    Taken when the valid multi-byte characters outnumber the invalid sequences four to one;
    those are replaced by U+FFFD and the encoding says how many."""
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.count("\ufffd".encode())
    good = sum(1 for ch in text if ord(ch) > 0x7F and ch != "\ufffd")
    if good == 0 or bad * 4 > good or _CONTROL.search(text):
        return None
    return text, f"utf-8 ({bad} invalid byte sequence{'s' if bad != 1 else ''} replaced by U+FFFD)"


# "15.5.5. 404 Not Found", "Appendix A. Collected ABNF", "3.2 Title", "A.1 Title".
# A lone number needs its trailing dot (or an "Appendix" word) so that a title such as
# "404 Not Found" or "2024 Results" is not read as section 404 / 2024.
_NUMBERED = re.compile(
    r"^(?:(?P<word>Appendix|Annex|Section|Chapter)\s+)?"
    r"(?P<num>(?:\d{1,4}|[A-Z])(?:\.\d{1,4})*)(?P<dot>[.)])?(?:\s+|$)(?P<title>.*)$"
)


def heading_number(text: str) -> tuple[str | None, str]:
    """Split a heading into (section number, title): "15.5.5. 404 Not Found" -> ("15.5.5",
    "404 Not Found"); an unnumbered heading gives (None, text)."""
    text = " ".join(text.split())
    m = _NUMBERED.match(text)
    if not m:
        return None, text
    num = m["num"]
    if "." not in num and not m["dot"] and not m["word"]:
        return None, text
    title = m["title"].strip() or text
    return num, title


def _split_lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _file_lines(text: str) -> list[str]:
    lines = _split_lines(text)
    if lines and lines[-1] == "":  # the final newline ends the last line, it starts none
        lines.pop()
    return lines


_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# Lines that cannot be the text of a setext heading: a "---" under them is a rule or a table.
_NOT_SETEXT_TEXT = re.compile(r"^(?: {4}|\t| {0,3}(?:[-*+>|]|\d+[.)])(?:\s|$))")


def _markdown_headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(index of the heading's first line, level, heading text) in file order."""
    found: list[tuple[int, int, str]] = []
    fence: str | None = None
    start = 0
    if lines and lines[0].strip() == "---":  # YAML front matter: its "---" is no heading
        for i in range(1, len(lines)):
            if lines[i].strip() in ("---", "..."):
                start = i + 1
                break
    for i in range(start, len(lines)):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = None
            continue
        if fence is not None:
            continue
        m = _ATX.match(line)
        if m:
            found.append((i, len(m.group(1)), (m.group(2) or "").strip()))
            continue
        m = _SETEXT.match(line)
        prev = lines[i - 1] if i > start else ""
        if (
            m
            and prev.strip()
            and not _ATX.match(prev)
            and not _NOT_SETEXT_TEXT.match(prev)
            and not (found and found[-1][0] == i - 1)
        ):
            found.append((i - 1, 1 if m.group(1)[0] == "=" else 2, prev.strip()))
    return found


def _front_matter_title(lines: list[str]) -> str | None:
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:40]:
        if line.strip() in ("---", "..."):
            break
        m = re.match(r"^title:\s*(.+?)\s*$", line)
        if m:
            return m.group(1).strip("'\"") or None
    return None


def _page(lines: list[str]) -> RawPage:
    return RawPage(lines=[RawLine(text=t) for t in lines])


def parse_text(
    path, data: bytes | None = None, *, markdown: bool
) -> tuple[list[RawPage], list[RawSection] | None, dict]:
    """Parse a text or Markdown file into (pages, sections, metadata).

    Text: one page per form-feed-separated chunk, or one page; sections None, meaning
    "not known structurally": `pipelines.ingest.sections` finds them in the lines (an empty list
    would tell it there are none). Markdown: one unit per ATX/setext heading, each a `RawSection`
    with the number taken from its text ("## 3.2 Title" -> "3.2"). Lines are verbatim.
    Raises `IngestError` for binary files, undecodable bytes and files without text.
    """
    raw = read_bytes(path, data)
    text, encoding = decode(path, raw)
    if not text.strip():
        raise IngestError(str(path), "no text content (empty file)")
    lines = _file_lines(text)
    meta: dict = {"encoding": encoding, "lines": len(lines)}
    if not markdown:
        chunks = text.split("\f")
        if len(chunks) > 1 and chunks[-1].strip() == "":
            chunks.pop()  # a trailing form feed ends the last page; it starts no blank one
        pages = [_page(_file_lines(c)) for c in chunks]
        meta["form_feed_pages"] = len(pages) > 1
        return pages, None, meta

    headings = _markdown_headings(lines)
    pages: list[RawPage] = []
    sections: list[RawSection] = []
    bounds = [h[0] for h in headings] + [len(lines)]
    if not headings or any(t.strip() for t in lines[: bounds[0]]):
        pages.append(_page(lines[: bounds[0]]))
    for k, (first, level, heading) in enumerate(headings):
        pages.append(_page(lines[first : bounds[k + 1]]))
        number, title = heading_number(heading)
        sections.append(RawSection(number=number, title=title, level=level, page=len(pages)))
    title = _front_matter_title(lines) or next((s.title for s in sections if s.level == 1), None)
    if title:
        meta["title"] = title
    return pages, sections, meta
