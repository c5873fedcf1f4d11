"""parse_text: encodings decided or refused, pages, verbatim lines, Markdown headings."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from docqa.pipelines.errors import IngestError
from docqa.pipelines.ingest.text import BINARY, NOT_DECODABLE, heading_number, parse_text

QA = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "qa"

FRENCH = (
    "Le ch\u00e2teau de la reine \u00e9tait tr\u00e8s \u00e9l\u00e9gant. O\u00f9 \u00eates-vous "
    "all\u00e9s cet \u00e9t\u00e9? Les \u00e9l\u00e8ves ont re\u00e7u leurs dipl\u00f4mes \u00e0 la "
    "c\u00e9r\u00e9monie.\n"
) * 3


def texts(pages):
    return [[ln.text for ln in p.lines] for p in pages]


# -- encodings --------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le-bom", "utf-16-be-bom", "utf-32"])
def test_unicode_encodings(codec):
    text = "Na\u00efve caf\u00e9 \u2014 \u6761\u6b3e 5.2\nsecond line\n"
    if codec == "utf-16-le-bom":
        data = b"\xff\xfe" + text.encode("utf-16-le")
    elif codec == "utf-16-be-bom":
        data = b"\xfe\xff" + text.encode("utf-16-be")
    else:
        data = text.encode(codec)
    pages, sections, meta = parse_text("f.txt", data, markdown=False)
    assert texts(pages) == [["Na\u00efve caf\u00e9 \u2014 \u6761\u6b3e 5.2", "second line"]]
    assert sections is None  # plain text: pipelines.ingest.sections finds them in the lines


def test_latin1_paragraph_is_detected():
    pages, sections, meta = parse_text("fr.txt", FRENCH.encode("latin-1"), markdown=False)
    assert texts(pages)[0][0] == FRENCH.splitlines()[0]
    assert meta["encoding"] != "utf-8"


def test_undecidable_latin1_fails_clearly():
    # Too little text to tell cp1252 from cp1250 or cp1006: refuse rather than guess.
    with pytest.raises(IngestError) as e:
        parse_text("short.txt", "The price is 5 \u00a3, a na\u00efve caf\u00e9.\n".encode("latin-1"), markdown=False)
    assert e.value.reason == NOT_DECODABLE
    assert str(e.value) == f"short.txt: {NOT_DECODABLE}"


def test_binary_is_refused():
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(4096))
    assert b"\x00" in data
    with pytest.raises(IngestError) as e:
        parse_text("blob.bin", data, markdown=False)
    assert e.value.reason == BINARY
    # Random high bytes without any NUL are not text in any encoding we would trust.
    noisy = bytes(rng.randrange(0x80, 0x100) for _ in range(4096))
    with pytest.raises(IngestError):
        parse_text("noise.txt", noisy, markdown=False)


def test_empty_and_missing(tmp_path):
    with pytest.raises(IngestError, match="no text"):
        parse_text("e.txt", b"", markdown=False)
    with pytest.raises(IngestError, match="no text"):
        parse_text("w.txt", b" \n\t\n", markdown=True)
    with pytest.raises(IngestError, match="cannot read"):
        parse_text(tmp_path / "missing.txt", markdown=False)


# -- pages and lines ----------------------------------------------------------------------------


def test_form_feeds_make_pages():
    data = b"page one a\npage one b\n\fpage two\r\n  indented  \n\f\npage three\n\f"
    pages, sections, meta = parse_text("ff.txt", data, markdown=False)
    assert texts(pages) == [
        ["page one a", "page one b"],
        ["page two", "  indented  "],  # verbatim: leading and trailing spaces kept
        ["", "page three"],  # the newline after a form feed is a (blank) first line
    ]


def test_one_page_lines_match_the_editor():
    data = b"one\r\ntwo\rthree\n\nfive" + b" x" * 300 + b"\n"
    pages, sections, meta = parse_text("t.txt", data, markdown=False)
    assert len(pages) == 1
    lines = texts(pages)[0]
    assert lines[:4] == ["one", "two", "three", ""]
    assert lines[4] == "five" + " x" * 300  # never wrapped: line 5 is line 5 in an editor
    assert meta["lines"] == 5


def test_real_text_file_with_crlf():
    # CUAD's README: UTF-8 with CRLF line ends, 372 lines (wc -l), second line read by hand.
    pages, sections, meta = parse_text(QA / "CUAD_v1_README.txt", markdown=False)
    lines = texts(pages)[0]
    assert len(pages) == 1 and len(lines) == 372
    assert lines[1] == "CONTRACT UNDERSTANDING ATTICUS DATASET"
    assert not any("\r" in ln for ln in lines)


# -- Markdown -------------------------------------------------------------------------------------

MARKDOWN = """\
---
title: The Agreement
---
Preamble text.

# 1. Definitions

Intro.

## 3.2 Payment Terms ##
Fees are due.

```python
# not a heading
x = 1
```

Setext Title
============

Under setext.

Second Level
------------

#hashtag is no heading
## 404 Not Found
text

- item
---
### Appendix A. Extra
"""


def test_markdown_headings_and_units():
    pages, sections, meta = parse_text("m.md", MARKDOWN.encode(), markdown=True)
    assert [(s.number, s.title, s.level) for s in sections] == [
        ("1", "Definitions", 1),
        ("3.2", "Payment Terms", 2),
        (None, "Setext Title", 1),
        (None, "Second Level", 2),
        (None, "404 Not Found", 2),
        ("A", "Extra", 3),
    ]
    units = texts(pages)
    assert units[0] == ["---", "title: The Agreement", "---", "Preamble text.", ""]
    for s in sections:
        assert s.element_id is None
    first_lines = [units[s.page - 1][0] for s in sections]
    assert first_lines == [
        "# 1. Definitions",
        "## 3.2 Payment Terms ##",
        "Setext Title",
        "Second Level",
        "## 404 Not Found",
        "### Appendix A. Extra",
    ]
    payment = units[sections[1].page - 1]
    assert "# not a heading" in payment and "```python" in payment  # code kept verbatim
    assert units[sections[2].page - 1][1] == "============"
    assert meta["title"] == "The Agreement"


def test_markdown_without_headings_is_one_unit():
    pages, sections, meta = parse_text("n.md", b"just text\nmore\n", markdown=True)
    assert texts(pages) == [["just text", "more"]] and sections == []


def test_markdown_title_from_first_h1():
    pages, sections, meta = parse_text("h.md", b"# Guide\n\nbody\n", markdown=True)
    assert meta["title"] == "Guide" and len(pages) == 1


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("15.5.5. 404 Not Found", ("15.5.5", "404 Not Found")),
        ("3.2 Payment Terms", ("3.2", "Payment Terms")),
        ("Appendix A. Collected ABNF", ("A", "Collected ABNF")),
        ("B.3.1.4. Supported Groups Extension", ("B.3.1.4", "Supported Groups Extension")),
        ("1. Introduction", ("1", "Introduction")),
        ("404 Not Found", (None, "404 Not Found")),
        ("2024 Results", (None, "2024 Results")),
        ("A Tale of Two Cities", (None, "A Tale of Two Cities")),
        ("Abstract", (None, "Abstract")),
    ],
)
def test_heading_number(heading, expected):
    assert heading_number(heading) == expected
