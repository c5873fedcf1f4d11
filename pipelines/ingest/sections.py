"""Numbered sections of a document: headings found in the lines (PDF, text) or given by the
parser (HTML), laid out as a tree with exact offsets.

Precision matters more than recall here: a false heading cuts a clause in two and sends
citations and clause references to the wrong place, while a missed heading only makes its
parent section longer. So a line becomes a heading only when several weak signals agree:

- it *starts* with a heading number ("5.2.1", "ARTICLE VII", "Exhibit B", "第一百四十三条");
- what follows reads like a title, or the number continues the numbering exactly;
- the numbering is monotone among siblings and consistent with its parent ("3.1.7" may
  follow "3.1.6" under "3.1", never "4.2" under "Article III");
- it is not part of a table of contents (dot leaders, trailing page numbers, a "Contents"
  marker, or a run of headings that ends where the first entry repeats in the body);
- lines in running text (wrapped cross-references such as "Section 4.7 (Exchange of Data)
  the clinical data ...") follow a line that did not end a sentence, which weak candidates
  must not do;
- a contract may mix numbering schemes: a plain list numbered from 1 inside a clause ("1
  Service Desk" under "3. SUPPLY OF SERVICES") is not a run of clauses; its items are told
  from the clauses by position (where the list opened, what it continues) and by how they are
  written (capitals, a line of their own, a dot), not by their numbers (`_in_plain_list`).

Annual reports (10-K) are cut by PART (I-IV) and Item (1, 1A, 7, 7A, 8, 15, ...): an Item
heading is "Item 7." at the start of a line, its number must increase through the whole
filing, and the pages of the table of contents — many Items on one page, with page numbers,
or from three or more PARTs and coming again further on — are skipped, so each Item starts
where its body starts. An Item named at the start of a line that goes on from a sentence
("… see" / "Item 1A - Risk Factors.") is a cross-reference unless printed in capitals.

Levels come from a stack of heading *ranks* (annexes above articles/chapters above
numbered sections, deeper numbers below), so the same rules fit contracts, specifications
and the 编/分编/章/节/条 hierarchy of Chinese statutes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..document import Document, RawSection, Section, Span

__all__ = ["detect_sections", "section_key", "chinese_to_int", "roman_to_int", "looks_like_title"]

# ---------------------------------------------------------------------------------------
# Numbers

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5,
              "六": 6, "七": 7, "八": 8, "九": 9}
_CN_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10000}
CN_NUM = "零〇一二两三四五六七八九十百千万"


def chinese_to_int(s: str) -> int | None:
    """'一百四十三' -> 143, '十二' -> 12, '二〇二〇' -> 2020 (digit by digit), '12' -> 12."""
    if not s:
        return None
    if s.isdigit():
        return int(s)
    if all(c in _CN_DIGITS for c in s) and len(s) > 1:  # a year written digit by digit
        return int("".join(str(_CN_DIGITS[c]) for c in s))
    total, section, digit = 0, 0, None
    for c in s:
        if c in _CN_DIGITS:
            digit = _CN_DIGITS[c]
        elif c in _CN_UNITS:
            unit = _CN_UNITS[c]
            if unit == 10000:
                total += (section + (digit or 0)) * unit
                section, digit = 0, None
            else:
                section += (1 if digit is None else digit) * unit
                digit = None
        else:
            return None
    return total + section + (digit or 0)


_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
_ROMAN_RE = re.compile(r"^M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")


def roman_to_int(s: str) -> int | None:
    s = s.upper()
    if not s or not _ROMAN_RE.match(s):
        return None
    total = 0
    for a, b in zip(s, s[1:] + " "):
        v = _ROMAN[a]
        total += -v if b != " " and _ROMAN[b] > v else v
    return total


def _path(num: str) -> tuple[int, ...]:
    """'5.2.1' -> (5, 2, 1); '5.0' -> (5,): 'Section 5.0' and 'Section 5' are one section."""
    parts = [int(p) for p in num.strip(".").split(".") if p]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


_ANNEX_KINDS = {"exhibit", "schedule", "appendix", "attachment", "annex", "addendum"}
_CN_KINDS = {"编": 0, "分编": 1, "章": 2, "节": 3, "条": 4}


def section_key(number: str | None) -> tuple | None:
    """The comparable identity of a section number as printed, shared by sections and the
    clause references that point at them: 'ARTICLE VII' and 'Article 7' -> ('article', 7);
    '5.0' and 'Section 5' -> ('num', (5,)); 'EXHIBIT B' -> ('exhibit', 'B');
    '第一百四十三条' -> ('条', 143); '第5.2.1条' -> ('num', (5, 2, 1))."""
    if not number:
        return None
    s = number.strip()
    m = re.fullmatch(r"第([" + CN_NUM + r"\d]+)(分编|编|章|节|条)", s)
    if m:
        n = chinese_to_int(m.group(1))
        return (m.group(2), n) if n is not None else None
    m = re.fullmatch(r"第(\d+(?:\.\d+)+)条", s)
    if m:
        return ("num", _path(m.group(1)))
    m = re.fullmatch(r"(?:(section|sections|§|§§)\s*)?(\d+(?:\.\d+)*)\.?", s, re.I)
    if m:
        return ("num", _path(m.group(2)))
    m = re.fullmatch(r"(article|chapter|part)s?\s+(\d+|[IVXLCDM]+)\.?", s, re.I)
    if m:
        v = m.group(2)
        n = int(v) if v.isdigit() else roman_to_int(v)
        return (m.group(1).lower(), n) if n is not None else None
    m = re.fullmatch(r"(exhibit|schedule|appendix|appendices|attachment|annex|addendum)s?"
                     r"(?:\s+(.+?))?\.?", s, re.I)
    if m:
        kind = m.group(1).lower()
        kind = "appendix" if kind == "appendices" else kind
        ident = (m.group(2) or "").upper()
        if ident.isdigit() or re.fullmatch(r"\d+(\.\d+)+", ident):
            ident = ".".join(str(p) for p in _path(ident))
        return (kind, ident)
    return None


# ---------------------------------------------------------------------------------------
# Line candidates

_WS = " \t\u3000\u00a0"
_NUM_RE = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){0,5})(\.?)[ \t\u3000]+(\S.*)$")
_KW_RE = re.compile(
    r"^(ARTICLE|Article|CHAPTER|Chapter|PART|Part|SECTION|Section|§)\s*"
    r"(\d{1,3}(?:\.\d{1,3}){0,5}|[IVXLC]{1,7}|[A-Z])(?![\w(])(\.?)(.*)$"
)
_ANNEX_RE = re.compile(
    r"^(EXHIBIT|Exhibit|SCHEDULE|Schedule|APPENDIX|Appendix|ATTACHMENT|Attachment|ANNEX|Annex"
    r"|ADDENDUM|Addendum)"
    r"(?:\s+([A-Z](?:-\d{1,2})?|\d{1,3}(?:\.\d{1,3})*(?:\([a-z0-9]{1,3}\))?))?(?![\w(])"
    r"(.*)$"
)
_ITEM_RE = re.compile(r"^(ITEM|Item)\s+(\d{1,2})([A-C])?(?![\w(])(\.|:)?(.*)$")
_CN_RE = re.compile(
    r"^第([" + CN_NUM + r"]{1,8}|\d{1,4})(分编|编|章|节|条)(?:[ \t\u3000]+(.*)|$)"
)
_CN_UNNUMBERED = {"附则", "附  则", "附 则"}
_DOT_LEADER = re.compile(r"(?:\.\s?){4,}|…{2,}|(?:·\s?){4,}")
_TRAILING_PAGE = re.compile(r"\s(?:Page\s+)?(?:\d{1,3}|[ivxlc]{1,5})$")
_CONTENTS = re.compile(r"^(table of contents|contents|目\s*录|index|table des matières)$", re.I)
_SMALL_WORDS = {"a", "an", "and", "or", "of", "the", "to", "in", "on", "for", "by", "with",
                "at", "as", "from", "into", "vs", "via", "not", "its", "upon", "under"}


_ITEM_RANK = 1.5  # below PART (1), above any numbered section (2 and deeper)


def _item_part(path: tuple[int, ...]) -> int:
    """The PART a 10-K Item belongs to: 1-4 in I, 5-9 in II, 10-14 in III, 15-16 in IV."""
    return 1 if path[0] <= 4 else 2 if path[0] <= 9 else 3 if path[0] <= 14 else 4


@dataclass
class _Cand:
    line: int  # index into the flat list of body lines
    kind: str  # 'num' | 'article' | 'chapter' | 'part' | annex kind | Chinese kind | 'cn-none'
    number: str | None  # as printed
    key: tuple | None
    rank: float
    path: tuple[int, ...] | None  # numeric identity used for sequence checks
    title: str
    rest: str  # the line after the number
    caps: bool  # keyword written in capitals: a strong signal
    keyword: bool  # introduced by a keyword (SECTION, ARTICLE, ...)
    dot: bool = False  # "4." rather than "4": part of a numbering scheme's look


def looks_like_title(text: str) -> bool:
    """Short, and written as a title: capitals, or mostly capitalised significant words."""
    t = text.strip().rstrip(".:")
    if not t or len(t) > 100:
        return False
    words = re.findall(r"[A-Za-z][\w'’\-/]*", t)
    if not words or len(words) > 14:
        return False
    if t.upper() == t:
        return True
    if words[0][0].islower():
        return False
    sig = [w for w in words if w.lower() not in _SMALL_WORDS]
    if not sig:
        return False
    caps = sum(1 for w in sig if w[0].isupper() or not w[0].isalpha())
    return caps / len(sig) >= 0.6


def _first_fragment(rest: str) -> str:
    """The heading part of 'Licenses. Subject to the terms ...' -> 'Licenses'."""
    m = re.match(r"(.+?)[.:](?:\s|$)", rest)
    return (m.group(1) if m else rest).strip()


def _classify(text: str, idx: int) -> _Cand | None:
    s = text.strip(_WS)
    if not s or len(s) > 400:
        return None
    m = _CN_RE.match(s)
    if m:
        kind = m.group(2)
        n = chinese_to_int(m.group(1))
        if n is None:
            return None
        rest = (m.group(3) or "").strip(_WS)
        if kind == "条":
            title = re.split(r"[，。；：,;:]", rest, maxsplit=1)[0][:40]
        else:
            if len(rest) > 30 or re.search(r"[，。；]", rest):
                return None
            title = rest
        return _Cand(idx, kind, f"第{m.group(1)}{kind}", (kind, n), _CN_KINDS[kind], (n,),
                     title, rest, True, True)
    if s in _CN_UNNUMBERED:
        return _Cand(idx, "cn-none", None, ("cn-none", s), 0, None, s.replace(" ", ""), "",
                     True, True)
    m = _ITEM_RE.match(s)
    if m:
        kw, num, letter, dot, rest = m.groups()
        rest = rest.strip(_WS)
        # "Item 8, Financial Statements ... of this report", "Item 15 of this Annual Report":
        # references in running text, not headings.
        if rest[:1] in {",", ";", ")"} or (rest[:1].isalpha() and rest[:1].islower()):
            return None
        title = re.sub(r"(?:\s*\.)?\s+\d{1,3}$", "", rest.lstrip(":-–—. ")).strip().rstrip(".")
        path = (int(num), ord(letter) - ord("A") + 1 if letter else 0)
        return _Cand(idx, "item", f"Item {num}{letter or ''}", ("item", path), _ITEM_RANK, path, title, rest,
                     kw.isupper(), True)
    m = _ANNEX_RE.match(s)
    if m:
        kw, ident, rest = m.group(1), m.group(2), m.group(3)
        kind = kw.lower()
        if ident is None and kind != "addendum":
            return None
        rest = rest.strip(_WS)
        if rest[:1] in {",", ")"} or (rest[:1] == "." and rest[1:].strip()):
            return None
        title = rest.lstrip(":-–—. ").strip()
        number = f"{kw} {ident}" if ident else kw
        return _Cand(idx, kind, number, section_key(number), 0, None, title, rest,
                     kw.isupper(), True)
    m = _KW_RE.match(s)
    if m:
        kw, num, dot, rest = m.groups()
        rest = rest.strip(_WS)
        kind = {"section": "num", "§": "num"}.get(kw.lower(), kw.lower())
        if kind == "num":
            if not num[0].isdigit():
                return None
            path = _path(num)
            rank = 1 + len(path)
            key = ("num", path)
        else:
            n = int(num) if num.isdigit() else roman_to_int(num)
            if n is None and len(num) == 1:
                n = ord(num) - ord("A") + 1
            if n is None:
                return None
            path, rank = (n,), 1
            key = (kind, n)
        title = rest.lstrip(":-–—. ").strip()
        number = num if kind == "num" else f"{kw} {num}"
        return _Cand(idx, kind, number, key, rank, path, title, rest, kw.isupper(), True)
    m = _NUM_RE.match(s)
    if m:
        num, dot, rest = m.groups()
        first = rest[0]
        if not (first.isalpha() or first in "“\"'‘"):
            return None
        if first.isalpha() and first.islower():
            return None
        path = _path(num)
        if path[0] == 0 and len(path) == 1:
            return None
        title = _first_fragment(rest)
        q = re.match(r"[“\"‘]([^”\"’]{1,80})[”\"’]", rest)
        if q:  # a numbered definition: '1.18 “FDA” means ...' is titled by its term
            title = q.group(1)
        if len(title) > 80:
            title = title[:80].rsplit(" ", 1)[0] + "…"
        return _Cand(idx, "num", num.rstrip("."), ("num", path), 1 + len(path), path,
                     title, rest, False, False, dot=bool(dot))
    return None


def _drop_running_heads(cands: list[_Cand | None], edge: list[bool]) -> None:
    """A page header such as '28 Volume II: RISC-V Privileged Architectures' looks like a
    numbered heading; the same words after ever-changing numbers give it away."""
    counts: dict[str, int] = {}
    for c in cands:
        if c is not None and c.kind == "num" and c.rest and edge[c.line]:
            counts[c.rest] = counts.get(c.rest, 0) + 1
    for i, c in enumerate(cands):
        if c is not None and c.kind == "num" and edge[c.line] and counts.get(c.rest, 0) >= 3:
            cands[i] = None


def _loose_key(c: _Cand) -> tuple | None:
    """'Chapter 1' in the body and '1 Introduction . . . 1' in the contents are one entry."""
    if c.kind in {"num", "chapter", "article", "part"} and c.path:
        return ("n", c.path)
    return c.key


def _toc_form(s: str, cand: _Cand | None) -> bool:
    if _DOT_LEADER.search(s):
        return True
    # "1 Grant 2": a title followed by a page number. The number must follow a word, so
    # "EXHIBIT 1.5" or "Schedule 1" (the number is the heading's own) do not count.
    return bool(cand and cand.title and re.search(r"[A-Za-z)]\s+(?:Page\s+)?\d{1,3}$",
                                                  cand.title))


def _ends_sentence(s: str) -> bool:
    s = s.rstrip(_WS)
    return not s or s[-1] in ".:;!?)]”\"’。；：！？）" or s.upper() == s


def _is_trivial(s: str) -> bool:
    """Blank lines and bare page numbers: they neither end nor continue a sentence."""
    s = s.strip(_WS)
    return not s or bool(re.fullmatch(r"[-–—\s]*(\d{1,4}|[ivxlcIVXLC]{1,6})[-–—\s]*", s))


# ---------------------------------------------------------------------------------------
# Tree building


@dataclass
class _Node:
    cand: _Cand | None
    start: int
    last_child: dict[int, tuple[int, ...]] = field(default_factory=dict)
    last_annex: dict[str, str] = field(default_factory=dict)
    section_index: int = -1


def _fit(cand: _Cand, parent: _Node, anc_path: tuple[int, ...] | None) -> str:
    """How well a numbered candidate continues the numbering: perfect / good / bad."""
    path = cand.path
    assert path is not None
    prev = parent.last_child.get(cand.rank)
    if anc_path is not None:
        if path[: len(anc_path)] != anc_path or len(path) <= len(anc_path):
            return "bad"
    if prev is None:
        first = path[-1]
        if anc_path is None and len(path) > 1:
            # the parent number is unknown: the heading still must start a sequence
            return "good" if first == 1 else "bad"
        return "perfect" if first == 1 else "good" if first <= 3 else "bad"
    if len(prev) != len(path) or prev[:-1] != path[:-1]:
        return "good" if path[-1] <= 3 else "bad"
    step = path[-1] - prev[-1]
    return "perfect" if step == 1 else "good" if 1 < step <= 3 else "bad"


def detect_sections(doc: Document, raw: list[RawSection] | None = None) -> list[Section]:
    """The document's sections in reading order, as a tree (level, parent_id) with char,
    page and line spans. HTML parsers pass their structural `raw` sections; otherwise the
    headings are found in the body lines (see the module docstring for the heuristics)."""
    if raw is not None:
        return _from_raw(doc, raw)
    return _from_lines(doc)


def _from_raw(doc: Document, raw: list[RawSection]) -> list[Section]:
    starts = []
    for r in raw:
        if not 1 <= r.page <= len(doc.pages):
            continue
        starts.append((doc.pages[r.page - 1].start, r))
    starts.sort(key=lambda t: t[0])
    out: list[Section] = []
    stack: list[tuple[int, int]] = []  # (level, index into out)
    ends: list[int] = []
    for start, r in starts:
        while stack and stack[-1][0] >= r.level:
            ends[stack.pop()[1]] = start
        parent = out[stack[-1][1]].id if stack else None
        out.append(_section(doc, len(out), r.number, r.title, len(stack) + 1, parent, start,
                            start, r.element_id))
        ends.append(len(doc.text))
        stack.append((r.level, len(out) - 1))
    return [_with_end(doc, s, e) for s, e in zip(out, ends)]


def _section(doc, i, number, title, level, parent, start, end, element_id=None) -> Section:
    loc = doc.locate(start)
    return Section(id=f"s{i + 1}", number=number, title=title, level=level, parent_id=parent,
                   span=Span(page=loc.page, page_end=loc.page, element_id=element_id, line_start=loc.line,
                             line_end=loc.line, char_start=start, char_end=end))


def _with_end(doc: Document, s: Section, end: int) -> Section:
    # The separator before the next heading belongs to no line; step back over it.
    last = end
    while last > s.span.char_start and doc.text[last - 1] in "\n\f":
        last -= 1
    loc = doc.locate(max(s.span.char_start, last - 1))
    return s.model_copy(update={"span": s.span.model_copy(update={"char_end": end, "page_end": loc.page,
                                                                   "line_end": loc.line})})


def _from_lines(doc: Document) -> list[Section]:
    lines = [ln for p in doc.pages for ln in p.lines if ln.role == "body"]
    edge = [ln.n <= 2 or ln.n >= len(p.lines) - 1
            for p in doc.pages for ln in p.lines if ln.role == "body"]
    texts = [ln.text.strip(_WS) for ln in lines]
    cands = [_classify(t, i) for i, t in enumerate(texts)]
    _drop_running_heads(cands, edge)
    in_toc = _mark_toc(texts, cands)
    page_of = [p.n for p in doc.pages for ln in p.lines if ln.role == "body"]
    _mark_item_toc(cands, page_of, in_toc)

    prev_ended = [True] * len(lines)
    mid_sentence = [False] * len(lines)  # the last line stopped on a word or a comma
    last_item_line = {c.key: c.line for c in cands if c is not None and c.kind == "item" and not in_toc[c.line]}
    last_real = None
    for i, t in enumerate(texts):
        prev_ended[i] = last_real is None or _ends_sentence(last_real) or (
            i > 0 and cands[i - 1] is not None)
        mid_sentence[i] = not prev_ended[i] and bool(re.search(r"[a-z,]$", last_real or ""))
        if not _is_trivial(t):
            last_real = t

    root = _Node(None, 0)
    stack: list[_Node] = [root]
    nodes: list[_Node] = []
    titles: list[str] = []
    parents: list[int | None] = []
    cn_last: dict[float, int] = {}
    seen_annex: set[tuple] = set()
    plain_list: _List | None = None
    for c in cands:
        if c is None or in_toc[c.line]:
            continue
        if c.kind == "num" and not c.keyword and len(c.path) == 1:
            plain_list, in_list = _in_plain_list(c, stack, plain_list)
            if in_list:
                continue
        if c.number and any(n.cand.key == c.key and n.cand.title.upper() == c.title.upper()
                            for n in stack[1:]):
            continue  # a running header repeating the open section's heading
        if c.kind in _ANNEX_KINDS and c.number:
            if c.line < 3 and "." in c.number:
                continue  # a filing label such as "Exhibit 10.6" atop the whole document
            if c.key in seen_annex:
                continue  # "ATTACHMENT 6" repeated atop every page of the attachment
        keep = _keep_depth(stack, c)
        parent = stack[keep - 1]
        if c.kind == "item" and not c.caps and mid_sentence[c.line] and last_item_line[c.key] > c.line:
            continue  # "… see" / "Item 1A - Risk Factors.", with the heading further on
        if not _accept(c, stack, keep, parent, prev_ended[c.line], cn_last):
            continue
        title = c.title
        if not title and c.keyword and c.line + 1 < len(texts):
            nxt = texts[c.line + 1]
            if nxt and cands[c.line + 1] is None and (
                    len(nxt) <= 90 and (looks_like_title(nxt) or c.kind == "chapter")
                    or c.kind == "item" and len(nxt) <= 150 and _item_title(nxt)):
                title = nxt  # "ITEM 7." on a line of its own, its title on the next
        del stack[keep:]
        if c.path is not None:
            parent.last_child[c.rank] = c.path
            if c.kind in _CN_KINDS:
                cn_last[c.rank] = c.path[0]
            elif c.kind == "item":
                cn_last[c.rank] = c.path
        if c.kind in _ANNEX_KINDS and c.number:
            seen_annex.add(c.key)
            parent.last_annex[c.kind] = c.key[1]
        plain_list = None  # a list ends where the next heading starts
        node = _Node(c, lines[c.line].start, section_index=len(nodes))
        parents.append(parent.section_index if parent is not root else None)
        stack.append(node)
        nodes.append(node)
        titles.append(title)

    out: list[Section] = []
    ends: list[int] = []
    open_: list[int] = []
    for i, n in enumerate(nodes):
        while open_ and open_[-1] != parents[i]:
            ends[open_.pop()] = n.start
        parent = out[parents[i]].id if parents[i] is not None else None
        out.append(_section(doc, i, n.cand.number, titles[i], len(open_) + 1, parent,
                            n.start, n.start))
        ends.append(len(doc.text))
        open_.append(i)
    return [_with_end(doc, s, e) for s, e in zip(out, ends)]


@dataclass
class _List:
    """A plain-numbered list inside an open clause: "1 Service Desk", "2 Desktop Support"
    under "3. SUPPLY OF SERVICES". Its numbers are a second scheme, not clauses: taken by
    number alone, "4 Backup and Recovery" would be clause 4, and "8 Sub-Contractors" (the
    last obligation listed under "6.") would swallow the real "7. TERMINATION" after it."""

    last: int
    look: tuple[bool, bool, bool]


def _look(c: _Cand) -> tuple[bool, bool, bool]:
    """How a one-number heading is written: in capitals, as a whole line (nothing runs on
    after the title), with a dot after the number."""
    letters = re.sub(r"[^A-Za-z]", "", c.title)
    return (bool(letters) and letters.isupper(), c.rest.rstrip(".: ") == c.title, c.dot)


def _prominence(look: tuple[bool, bool, bool]) -> int:
    # capitals are the surest sign of a clause heading, then a line of its own, then the dot
    return 4 * look[0] + 2 * look[1] + look[2]


def _unlike(a: tuple[bool, bool, bool], b: tuple[bool, bool, bool]) -> int:
    return sum(w for w, x, y in zip((4, 2, 1), a, b) if x != y)


def _in_plain_list(c: _Cand, stack: list[_Node], plain: _List | None) -> tuple[_List | None, bool]:
    """Whether a one-number candidate is an item of a list nested in the open clause, decided
    by position and nesting, not by the number alone: a list starts at 1 inside a clause,
    written less prominently than the clause's own heading; an item continues it (the list's
    next number) unless it continues the clauses instead and is written like a clause
    ("4 CHARGES AND PAYMENT" after "3. SUPPLY OF SERVICES" and a list ending at 3)."""
    clause = next((n.cand for n in reversed(stack[1:])
                   if n.cand.kind == "num" and len(n.cand.path) == 1 and not n.cand.keyword), None)
    if clause is None:
        return None, False
    n, look = c.path[0], _look(c)
    if plain is not None and n == plain.last + 1:
        next_clause = 1 <= n - clause.path[0] <= 3
        if not next_clause or _unlike(look, plain.look) <= _unlike(look, _look(clause)):
            plain.last = n
            return plain, True
    if n == 1 and _prominence(look) < _prominence(_look(clause)):
        return _List(1, look), True
    return plain, False


def _compatible(anc: _Cand, c: _Cand) -> bool:
    """Whether `anc` can contain `c`: numbered sections contain only their own sub-numbers
    ('3.1' holds '3.1.7', not '4.2'); Chinese and annex levels contain anything below."""
    if anc.kind != "num" or c.kind != "num":
        return True
    return c.path[: len(anc.path)] == anc.path


def _keep_depth(stack: list[_Node], c: _Cand) -> int:
    keep = 1
    for n in stack[1:]:
        if n.cand.rank < c.rank and _compatible(n.cand, c):
            keep += 1
        else:
            break
    return keep


def _numeric_ancestor(stack: list[_Node], keep: int, c: _Cand) -> tuple[int, ...] | None:
    """The number path a numbered candidate must extend: its nearest numbered ancestor, or
    the number of the enclosing article/chapter ('ARTICLE II' -> (2,))."""
    for n in reversed(stack[1:keep]):
        a = n.cand
        if a.kind == "num":
            return a.path
        if a.kind in {"article", "chapter"} and a.path and len(c.path) > 1:
            return a.path
        if a.rank == 0:
            return None
    return None


def _accept(c: _Cand, stack: list[_Node], keep: int, parent: _Node, prev_ended: bool,
            cn_last: dict[int, int]) -> bool:
    if c.kind in _CN_KINDS:
        n = c.path[0]
        prev = parent.last_child.get(c.rank)
        if c.kind == "条":
            # article numbers run through the whole statute, whatever the chapter
            last = cn_last.get(c.rank)
            if last is None:
                return n <= 3
            return last < n <= last + 5
        if prev is not None:
            return prev[0] < n <= prev[0] + 3
        return True
    if c.kind == "cn-none":
        return prev_ended
    if c.kind == "item":
        # Items run through the whole filing (PART I holds 1-4, PART II 5-9, ...).
        last = cn_last.get(c.rank)
        if last is not None and not (last < c.path and c.path[0] <= last[0] + 6):
            return False
        # "Item 7." at a line's start is a strong signal; the title only must not read as
        # a sentence's continuation, nor run on into one ("Item 3—Legal Proceedings—…
        # Diversions, which includes …" is a cross-reference in running text).
        if c.title and not (c.title[0].isupper() or c.title.startswith("[")):
            return False
        return c.caps or not c.title or _item_title(_first_fragment(c.title))
    if c.kind in _ANNEX_KINDS:
        if c.caps:
            return not c.title or looks_like_title(c.title) or prev_ended
        # mixed case is how running text names annexes ("Attachment F - Product
        # Attachment - OEM C, Global ..." in a list), so the line must be a bare title
        return (prev_ended or _next_annex(c, parent)) and len(c.rest) <= 60 and (
            not c.title or (looks_like_title(c.title) and "," not in c.title))
    if c.kind in {"article", "chapter", "part"}:
        if c.kind == "part" and not c.caps:
            return False
        if not (c.caps or prev_ended or not c.rest):
            return False  # "Chapter 4" alone on its line is a heading wherever it follows
        if c.title and not looks_like_title(c.title):
            return False
        prev = parent.last_child.get(c.rank)
        return prev is None or prev[0] < c.path[0] <= prev[0] + 3
    # numbered sections, with or without the SECTION keyword
    if len(c.path) == 1 and not c.keyword and any(
            n.cand.kind in {"article", "chapter"} for n in stack[1:keep]):
        return False  # inside "Chapter 3" the sections are 3.x; a bare "2" is a table row
    if c.keyword and c.rest[:1] in {"(", ",", ")"}:
        return False
    if c.keyword and not c.caps and not prev_ended:
        return False
    anc = _numeric_ancestor(stack, keep, c)
    fit = _fit(c, parent, anc)
    if fit == "bad" and anc is not None and len(c.path) == len(anc) + 1:
        # the parent heading itself was missed: accept the next top-level number only when
        # the line is unmistakably a heading
        if c.path[0] == anc[0] + 1 and c.path[-1] == 1 and prev_ended and looks_like_title(c.title):
            fit = "good"
    title_like = looks_like_title(c.title) and len(c.title) <= 90
    whole_title = title_like and c.rest.rstrip(".: ") == c.title
    if fit == "bad":
        # a fresh numbering run ("1. Introduction" after front-matter paragraphs 1-9)
        return (len(c.path) == 1 and c.path[0] == 1 and whole_title
                and (prev_ended or len(c.title.split()) <= 4)
                and anc is None and len(c.title.split()) <= 6
                and not re.search(r"\d", c.title))
    if c.keyword:
        return not c.title or title_like
    if len(c.path) == 1:
        # "23 APPROVALS AND WAIVERS" may follow a line cut off at a page break
        return title_like and (prev_ended or (fit == "perfect" and (
            c.title.isupper() or (whole_title and len(c.title.split()) <= 8))))
    if fit == "perfect":
        return True
    return prev_ended and (title_like or c.rest[:1] in "“\"‘")


def _item_title(text: str) -> bool:
    """An Item's title as filings print it, long ones included ("Market for Registrant's
    Common Equity, Related Stockholder Matters and Issuer Purchases of Equity Securities"):
    mostly capitalised words, not a sentence."""
    words = re.findall(r"[A-Za-z][\w'’\-/]*", text)
    sig = [w for w in words if w.lower() not in _SMALL_WORDS]
    return 0 < len(words) <= 24 and bool(sig) and sum(1 for w in sig if w[0].isupper()) >= 0.6 * len(sig)


def _next_annex(c: _Cand, parent: _Node) -> bool:
    """'Appendix B' right after 'Appendix A' continues a sequence, whatever precedes it."""
    prev = parent.last_annex.get(c.kind)
    ident = c.key[1] if c.key else ""
    if prev is None or not ident:
        return False
    if prev.isdigit() and ident.isdigit():
        return int(ident) == int(prev) + 1
    return len(prev) == len(ident) == 1 and ord(ident) == ord(prev) + 1


def _mark_item_toc(cands: list[_Cand | None], page_of: list[int], toc: list[bool]) -> None:
    """Items are headings only in a filing (PARTs and five or more distinct Items).
    A filing's contents page lists its Items (with page numbers, or from three PARTs on
    one page); its Item and PART lines are not sections, so each Item starts in the body."""
    by_page: dict[int, list[_Cand]] = {}
    part_pages: dict[int, set[int]] = {}
    for c in cands:
        if c is not None and c.kind == "item":
            by_page.setdefault(page_of[c.line], []).append(c)
        elif c is not None and c.kind == "part" and c.caps:
            part_pages.setdefault(page_of[c.line], set()).add(c.path[0])
    if not part_pages or len({c.path for items in by_page.values() for c in items}) < 5:
        # Not a filing: a franchise agreement's "Item 5" refers to its disclosure document.
        for i, c in enumerate(cands):
            if c is not None and c.kind == "item":
                cands[i] = None
        return
    later: dict[tuple, int] = {}  # each Item's last page
    for c in cands:
        if c is not None and c.kind == "item":
            later[c.key] = page_of[c.line]
    for page in set(by_page) | set(part_pages):
        items = by_page.get(page, [])
        numbered = sum(1 for c in items if re.search(r"\d$", c.rest.strip()))
        parts = {_item_part(c.path) for c in items} | part_pages.get(page, set())
        # Three PART headings on one page only a contents page has. Without page numbers a
        # list of Items is a contents page only where its entries come again further on: a
        # body page holds the short Items of PARTs III and IV ("Item 10 ... incorporated by
        # reference") from three PARTs too.
        again = sum(1 for c in items if later[c.key] > page)
        if numbered >= 2 and len(items) >= 3 or len(part_pages.get(page, ())) >= 3 or (
                (len(items) >= 8 or len(parts) >= 3) and again >= max(3, len(items) // 2)):
            for c in cands:
                if c is not None and page_of[c.line] == page and c.kind in {"item", "part"}:
                    toc[c.line] = True


def _mark_toc(texts: list[str], cands: list[_Cand | None]) -> list[bool]:
    """Which lines belong to a table of contents (their headings are not sections)."""
    toc = [False] * len(texts)
    in_toc = False
    first_key = None
    i = 0
    n = len(texts)
    while i < n:
        s, c = texts[i], cands[i]
        if _CONTENTS.match(s) or re.fullmatch(r"Section\s+Title\s+Page#?", s, re.I):
            in_toc, first_key = True, None
            toc[i] = True
        elif _toc_form(s, c):
            if not in_toc:
                in_toc, first_key = True, None
            toc[i] = True
            if first_key is None and c is not None:
                first_key = _loose_key(c)
        elif in_toc:
            if _is_trivial(s):
                pass
            elif c is not None:
                if first_key is not None and _loose_key(c) == first_key:
                    in_toc = False  # the body starts where the first entry repeats
                    continue
                toc[i] = True
                if first_key is None:
                    first_key = _loose_key(c)
            else:
                # a title wrapped over two lines stays in the contents if entries follow
                ahead = [j for j in range(i + 1, min(n, i + 4)) if not _is_trivial(texts[j])]
                if ahead and any(_toc_form(texts[j], cands[j]) or cands[j] is not None
                                 for j in ahead[:2]):
                    toc[i] = True
                else:
                    in_toc = False
        i += 1
    return toc
