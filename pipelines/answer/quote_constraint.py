"""Quote-constrained answering: the model chooses what to quote and which passage to cite, but
can only write text that the citation verifier can check.

A small model asked to quote paraphrases instead, so none of its citations verify. Here its
answer is decoded in the format the prompt asks for, one citation per line:

    "governed by the laws of the State of New York" [PAGE:3, LINE:1-2]

or the abstain sentence `Not found in the document.` At every step the model's own scores
rank the tokens, and the best-ranked token that keeps the constraint is taken:

- at the start, the model chooses between answering and abstaining: its log-odds of any first
  word but the abstain sentence's over that sentence's; an answer opens a quote with the best
  of the tokens that can — the bare mark, or one that joins it to the quote's first word
  ('"This'), which is how a BPE vocabulary trained on prose writes a quote;
- inside a quote, the quote (normalised like the verifier does, but keeping case) must stay a
  substring, starting at a word, of the text of some passage in the model's context; it may
  close only past `min_quote_chars` and at the end of a word. A quotation mark the source has
  at that point is part of the quote (contracts define their terms in quotes: `dated as of
  May 31, 2017 (the "Effective Date")`); a mark the source does not continue with closes it,
  and only once the marks inside are paired, so that `citations.parse_citations` reads the
  quote back whole;
- after a quote, the label must stay a prefix of the label of a passage that contains the
  quote; after a label, the model chooses between another quote and the end.

The quote comes first because a small model copies text it has read far better than it maps
a question to page and line numbers; the label then follows from where the words are.
Nothing here marks anything verified: the answer goes through `citations.verify` like any
model answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..document import Passage
from ..textnorm import _HYPHEN_BREAK, _QUOTES, _SPACE

ABSTAIN = "Not found in the document."
_QUOTE_CHARS = '"\u201c\u201d\u201e'
_ODD_SPACE = re.compile(r"[^\S ]")  # any blank but a plain space


def norm_cased(text: str) -> str:
    """`textnorm.normalize` without casefolding: a quote matching under it also matches under
    the verifier's normalisation, and is written in the source's own case."""
    text = _HYPHEN_BREAK.sub(r"\1", text)
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return _SPACE.sub(" ", text).strip()


@dataclass(frozen=True)
class QuotePlan:
    """What the answer may cite: one label per passage the model read, with that passage's text."""

    labels: tuple[str, ...]
    sources: tuple[str, ...]
    abstain: str | None = ABSTAIN
    max_citations: int = 2
    min_quote_chars: int = 20
    max_quote_tokens: int = 60


def plan_for(passages: Sequence[Passage], *, with_doc: bool = False, **kw) -> QuotePlan:
    seen: dict[str, str] = {}
    for p in passages:
        seen.setdefault(p.cite_label(with_doc=with_doc), p.text)
    return QuotePlan(labels=tuple(seen), sources=tuple(seen.values()), **kw)


class TokenTable:
    """Each token's text for one vocabulary (so constraints are checked on strings), and the
    ids of each text (so the tokens that spell the next characters of a label are found
    without scanning the vocabulary)."""

    def __init__(self, texts: Sequence[str], stop_ids: Sequence[int], encode: Callable[[str], list[int]]):
        self.texts = list(texts)
        self.stop_ids = tuple(stop_ids)
        self.encode = encode
        self.by_text: dict[str, list[int]] = {}
        for i, t in enumerate(self.texts):
            # A lone token of a multi-byte character decodes to U+FFFD: not text on its own.
            if t and "\ufffd" not in t:
                self.by_text.setdefault(t, []).append(i)
        self.max_len = max((len(t) for t in self.by_text), default=1)
        self.quote_id = self.by_text['"'][0]
        # Tokens that open a quote and begin its words at once ('"This', '"g'): a vocabulary
        # that merges the mark with the word after it (Qwen's, GPT-4's) seldom predicts the
        # bare mark before a word, so offering only that would make every quote look unlikely.
        self.openers = [(i, t[1:]) for t, ids in self.by_text.items()
                        if len(t) > 1 and t[0] == '"' and t[1].isalnum() for i in ids]
        # Every spelling of "yes" and of "no" as a reply's first word (the model's verdict, app/models.py).
        self.yes_no: tuple[list[int], list[int]] = tuple(
            [i for t, ids in self.by_text.items() if t.strip().lower() == w for i in ids] for w in ("yes", "no"))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenTable:
        texts = tokenizer.tok.decode_batch([[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=True)
        return cls(texts, tokenizer.stop_ids, lambda text: tokenizer.encode(text, add_bos=False))


def _occurs(needle: str, hay: str, *, at_word_end: bool, room: int = 0) -> bool:
    """`needle` occurs in `hay` starting at a word (and, if asked, ending at one), with at
    least `room` characters of `hay` from where it starts."""
    i = hay.find(needle)
    while i >= 0 and len(hay) - i >= room:
        j = i + len(needle)
        starts = i == 0 or not (hay[i - 1].isalnum() and needle[0].isalnum())
        ends = not at_word_end or j == len(hay) or not (hay[j].isalnum() and needle[-1].isalnum())
        if starts and ends:
            return True
        i = hay.find(needle, i + 1)
    return False


def _marks(text: str) -> int:
    return sum(c in _QUOTE_CHARS for c in text)


def _writable(q: str, t: str) -> bool:
    """Whether token text `t` may be written after the quote so far `q` at all (before asking
    whether a source holds the result)."""
    if not t or "\ufffd" in t or "\n" in t or "\r" in t:
        return False
    # Normalisation folds runs of blanks into one: without this a quote could grow by
    # blanks forever while still "matching".
    if (not q or q[-1].isspace()) and t[0].isspace() or "  " in t or _ODD_SPACE.search(t):
        return False
    # Compatibility forms ("º" for "o") match after NFKC but are not what the source says.
    if unicodedata.normalize("NFKC", t) != t:
        return False
    # Characters the normalisation deletes (soft hyphen, zero-width space): a token of only
    # those keeps any quote "matching", so a model could write them until the quote's limit
    # (Gemma 3's vocabulary has such tokens; measured in bench/results/ask.md).
    return not (t.strip() and not norm_cased(t))


@dataclass
class QuoteDecoder:
    """The per-step token chooser for `Engine.generate(choose=...)`."""

    plan: QuotePlan
    table: TokenTable
    top_n: int = 50
    max_tokens: int | None = None  # the generation's token limit: close a quote in time for its label
    cited: list[tuple[str, str]] = field(default_factory=list)  # (quote, label) written so far
    abstained: bool = False
    # The model's log-odds of quoting over abstaining at the first step, before any choice:
    # how sure it was that the excerpts answer the question (see `abstain_margin`).
    quote_margin: float | None = None
    abstain_margin: float = 0.0
    _partial: str = ""
    _options: list[tuple[str, str]] = field(default_factory=list)  # (string, what it commits to)
    _end_allowed: bool = False
    _quoting: bool = False
    _quote: str = ""
    _quote_tokens: int = 0
    _done: bool = False
    _texts: list[tuple[int, str]] = field(default_factory=list)  # (source index, its text as a quote matches it)
    _open: set[int] = field(default_factory=set)  # sources not cited yet: one citation each
    _label_room: int = 0  # tokens the longest label takes, closing quote included

    def __post_init__(self):
        self._texts = [(i, t) for i, t in enumerate(map(norm_cased, self.plan.sources))
                       if len(t) >= self.plan.min_quote_chars]
        self._open = set(range(len(self.plan.sources)))
        self._label_room = 2 + max((len(self.table.encode(" " + lab)) for lab in self.plan.labels), default=0)
        if self.plan.labels:
            self._options.append(('"', "quote"))
        if self.plan.abstain:
            self._options.append((self.plan.abstain, "abstain"))
        self._done = not self._options

    # -- engine hook ------------------------------------------------------------------------
    def __call__(self, logits, generated: Sequence[int]) -> int:
        # A checkpoint may pad its output rows past the tokenizer's vocabulary (for even
        # matrix shapes); those ids spell nothing, so they are never candidates.
        logits = logits[..., : len(self.table.texts)]
        if self._done:
            return self.table.stop_ids[0]
        if self._quoting:
            return self._quote_step(logits, len(generated))
        return self._option_step(logits, len(generated))

    # -- choosing among fixed strings --------------------------------------------------------
    def _option_step(self, logits, n_generated: int) -> int:
        if self._end_allowed and not self._partial and not self._room(n_generated, 12):
            self._done = True  # no room for another quote and its label: end here
            return self.table.stop_ids[0]
        cands: dict[int, None] = {}
        for s, _ in self._options:
            if not self._partial:
                # The choice between options is made on each option's first token as the
                # tokenizer writes it: "Not" for the abstain sentence, not "No" (an answer to a
                # yes/no question that merely spells the same letters).
                cands[self.table.encode(s)[0]] = None
                continue
            if not s.startswith(self._partial):
                continue
            rest = s[len(self._partial):]
            for k in range(1, min(len(rest), self.table.max_len) + 1):
                cands.update(dict.fromkeys(self.table.by_text.get(rest[:k], ())))
        if self._end_allowed and not self._partial:
            cands.update(dict.fromkeys(self.table.stop_ids))
        if self.quote_margin is None and not self._partial and not self.cited:
            return self._first_choice(logits)
        if self._partial and any(what == "quote" and s == self._partial + '"' for s, what in self._options):
            # Only the mark is left to write ("\n" of another quote is out): the bare mark or a merged opener.
            return self._open_quote(logits, self._openings())
        ids = list(cands)
        if not ids:  # cannot happen while the options are prefix-consistent; end rather than guess
            self._done = True
            return self.table.stop_ids[0]
        scores = logits[ids].tolist()
        best = ids[max(range(len(ids)), key=scores.__getitem__)]
        if best in self.table.stop_ids:
            self._done = True
            return best
        self._partial += self.table.texts[best]
        for s, what in self._options:
            if s == self._partial:
                self._commit(what)
                break
        return best

    def _first_choice(self, logits) -> int:
        """Answer or abstain: the model quotes only when its log-odds of answering at all —
        any first word but the abstain sentence's — over abstaining exceed `abstain_margin`, so
        a caller can ask for more confidence than a bare preference. An instruct model answers
        in its own way ("The", "[PAGE", "Governing …") far more often than it opens with a
        quote mark, so the mark's own weight would say nothing about whether it has an answer;
        what it answers with is then a quote, opened by its best-scored opening token."""
        first = {what: self.table.encode(s)[0] for s, what in self._options}
        openings = self._openings() if "quote" in first else []
        lp = logits.float().log_softmax(-1)
        if openings and "abstain" in first:
            abstain = lp[first["abstain"]]
            self.quote_margin = float((-abstain.exp()).log1p() - abstain)
            pick = "quote" if self.quote_margin > self.abstain_margin else "abstain"
        else:
            self.quote_margin = float("inf") if openings else float("-inf")
            pick = "quote" if openings else "abstain"
        if pick == "quote":
            return self._open_quote(lp, openings)
        token = first["abstain"]
        self._partial = self.table.texts[token]
        if self._partial == self.plan.abstain:
            self._commit("abstain")
        return token

    def _openings(self) -> list[tuple[int, str]]:
        """The tokens that open a quote here, with the quote's first characters each writes:
        the bare mark, and each merged opener whose word starts a quotable stretch."""
        out = [(self.table.quote_id, "")]
        out += [(i, rest) for i, rest in self.table.openers if self._extends("", rest)]
        return out

    def _open_quote(self, lp, openings: list[tuple[int, str]]) -> int:
        """Take the best-scored opening token and start the quote with what it spells."""
        token, rest = max(openings, key=lambda o: float(lp[o[0]]))
        self._commit("quote")
        if rest:
            self._quote, self._quote_tokens = rest, 1
        return token

    def _commit(self, what: str) -> None:
        self._partial = ""
        if what == "abstain":
            self.abstained = self._done = True
        elif what == "quote":
            self._quoting, self._quote, self._quote_tokens = True, "", 0
        else:  # a label: the citation is complete
            self.cited.append((self._quote, what))
            self._open.discard(self.plan.labels.index(what))
            self._done = len(self.cited) >= self.plan.max_citations or not self._open
            self._options, self._end_allowed = [('\n"', "quote")], True

    # -- quoting ----------------------------------------------------------------------------
    def _sources_with(self, q: str, *, at_word_end: bool) -> list[int]:
        nq = norm_cased(q)
        if q[-1:].isspace():  # a trailing blank is a claim that the word ends here
            nq, at_word_end = nq + " ", False
        if not nq.strip():
            return []
        # Room to reach the minimum length: a quote never walks into a stretch too short to close.
        room = self.plan.min_quote_chars
        return sorted({i for i, r in self._texts if i in self._open and _occurs(nq, r, at_word_end=at_word_end, room=room)})

    def _closable(self, q: str) -> bool:
        # The marks inside must pair up: an odd one would be read back as the quote's end.
        return len(norm_cased(q)) >= self.plan.min_quote_chars and _marks(q) % 2 == 0 \
            and bool(self._sources_with(q, at_word_end=True))

    def _close(self, head: str, token: int) -> int:
        self._quote = (self._quote + head).strip()
        self._quoting = False
        where = self._sources_with(self._quote, at_word_end=True) or self._sources_with(self._quote, at_word_end=False)
        self._options = [(" " + self.plan.labels[i], self.plan.labels[i]) for i in where]
        self._end_allowed = False
        return token

    def _try(self, token: int, n_generated: int) -> int | None:
        """`token` if it keeps the quote inside a source (or closes it properly), else None."""
        q = self._quote
        if token in self.table.stop_ids:  # the model wants to stop: close the quote instead
            return self._close("", self.table.quote_id) if self._closable(q) else None
        t = self.table.texts[token]
        if not _writable(q, t):
            return None
        if self._extends(q, t, n_generated):  # quotation marks included, where the source has them
            self._quote += t
            self._quote_tokens += 1
            return token
        cut = next((k for k, c in enumerate(t) if c in _QUOTE_CHARS), None)
        if cut is not None:  # a mark the source does not continue with: the closing quote
            head = t[:cut]
            # The label comes next, so nothing may follow the mark; only a closing mark closes
            # (an opening curly one would stay in the parsed quote).
            ok = cut == len(t) - 1 and t[cut] in '"\u201d' and not (q + head)[-1:].isspace() \
                and self._closable(q + head)
            return self._close(head, token) if ok else None
        return None

    def _extends(self, q: str, t: str, n_generated: int | None = None) -> bool:
        """Whether the token text `t` continues the quote `q` inside a source. A token that
        opens a quotation inside the quote needs room to close it before the label is due."""
        if not _writable(q, t):
            return False
        if _marks(q + t) % 2 and _marks(t) and n_generated is not None and not self._room(n_generated, 16):
            return False
        return bool(self._sources_with(q + t, at_word_end=False))

    def _room(self, n_generated: int, extra: int) -> bool:
        """Whether `extra` more tokens and a label still fit in the generation's limit."""
        return self.max_tokens is None or n_generated + self._label_room + extra < self.max_tokens

    def _quote_step(self, logits, n_generated: int) -> int:
        if (self._quote_tokens >= self.plan.max_quote_tokens or not self._room(n_generated, 8)) \
                and self._closable(self._quote):
            return self._close("", self.table.quote_id)
        if not self._room(n_generated, 0):  # the label must fit: close even where a quote should not
            return self._close("", self.table.quote_id)
        order = logits.topk(min(self.top_n, logits.shape[-1])).indices.tolist()
        for token in order:
            got = self._try(token, n_generated)
            if got is not None:
                return got
        if self._closable(self._quote):
            return self._close("", self.table.quote_id)
        # Rare: nothing the model ranks high fits; go down its ranking over the whole vocabulary.
        for token in logits.argsort(descending=True)[self.top_n:].tolist():
            got = self._try(token, n_generated)
            if got is not None:
                return got
        # A dead end (a character no single token spells): close; a quote too short to prove
        # anything will fail verification and not be shown as support.
        return self._close("", self.table.quote_id)
