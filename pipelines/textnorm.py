"""Text normalisation for matching: what we search and verify, never what we display.

One function decides when two pieces of text "say the same thing" for search and for
citation verification (SPEC §4): Unicode compatibility forms (ligatures such as "ﬁ"),
words hyphenated across a line break, curly quotes and dashes, runs of whitespace, and case.
"""

from __future__ import annotations

import re
import unicodedata

_QUOTES = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-",
        "\u00ad": None,  # soft hyphen
        "\u200b": None,  # zero-width space
        "\ufeff": None,
        "\u00a0": " ",
    }
)
# A word broken at a line end: "agree-\nment" -> "agreement". Only lowercase continuations,
# so "pre-\nApproved" and list dashes are kept.
_HYPHEN_BREAK = re.compile(r"(\w)-[ \t]*[\n\f][ \t]*(?=[a-z])")
_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Canonical form for matching: NFKC, joined hyphenation, plain quotes, one space, casefolded."""
    text = _HYPHEN_BREAK.sub(r"\1", text)
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return _SPACE.sub(" ", text).strip().casefold()


_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalize_loose(text: str) -> str:
    """`normalize` without punctuation: for quotes whose punctuation a model may garble."""
    return _SPACE.sub(" ", _NON_WORD.sub(" ", normalize(text))).strip()


def contains(haystack: str, needle: str, *, loose: bool = False) -> bool:
    """Whether `needle` occurs in `haystack` after normalisation (empty needles never match)."""
    f = normalize_loose if loose else normalize
    n = f(needle)
    return bool(n) and n in f(haystack)
