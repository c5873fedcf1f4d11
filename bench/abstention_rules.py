"""Score answer-withholding rules offline, on the raw answers a finished `ask_eval.py` run stored.

Each row of an `ask_eval.py --all` jsonl holds the model's raw answer (quotes with their
pages), the question, whether it is answerable and whether a kept answer cited the gold page.
A rule decides from the question and the quotes alone whether the answer is kept or withheld
as "Not found", so rules can be compared without running the model again. The first rule is
the shipped one (`pipelines/answer/qa.py` `on_subject`); it must reproduce the run's own counts
(printed last: the raw quotes stand in for the verified ones, so a run with unverified
quotes could differ).

    .venv/bin/python bench/abstention_rules.py bench/results/ask_all_2026-11-30-s4.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from docqa.pipelines.answer.qa import _AFFIXES, content_words, on_subject, stem, subject_words
from docqa.pipelines.answer.query import analyze, quoted_phrases

QUOTE = re.compile(r'"(.*?)"\s*\[PAGE:\d+')


def _subject_stems(question: str) -> set[str] | None:
    """Stems of the question's subject itself (no thesaurus); None for preamble questions."""
    q = analyze(question)
    quoted = quoted_phrases(q.text)
    subject = " ".join(quoted) if quoted else q.text
    if analyze(subject).preamble:
        return None
    return {stem(w) for w in content_words(subject)} - _AFFIXES


def _stems(quote: str) -> set[str]:
    return {stem(w) for w in content_words(quote)}


def shipped(question, quotes) -> bool:
    s = subject_words(question)
    return any(on_subject(q, s) for q in quotes)


def subject_only(question, quotes) -> bool:
    s = _subject_stems(question)
    return s is None or any(s & _stems(q) for q in quotes)


def whole_subject(question, quotes) -> bool:
    s = _subject_stems(question)
    return s is None or any(s <= _stems(q) for q in quotes)


RULES = {
    "keep every answer with a quote": lambda question, quotes: True,
    "shipped: a quote shares a subject or thesaurus word": shipped,
    "a quote shares a word of the subject itself": subject_only,
    "one quote holds every word of the subject": whole_subject,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    rows = [json.loads(line) for line in Path(ap.parse_args().jsonl).read_text().splitlines() if line]
    n_ans = sum(r["answerable"] for r in rows)
    n_un = len(rows) - n_ans
    print(f"| rule | answerable kept (of {n_ans}) | ... citing the gold page | unanswerable withheld (of {n_un}) |")
    print("| --- | --- | --- | --- |")
    for name, rule in RULES.items():
        kept = gold = withheld = 0
        for r in rows:
            quotes = QUOTE.findall(r["raw_answer"] or "")
            keep = bool(quotes) and rule(r["question"], quotes)
            if r["answerable"]:
                kept += keep
                gold += keep and (r["gold_hit"] or r["withheld_gold_hit"])
            else:
                withheld += not keep
        print(f"| {name} | {kept} | {gold} | {withheld} |")
    run_kept = sum(r["answerable"] and r["status"] == "answered" for r in rows)
    run_withheld = sum(not r["answerable"] and r["status"] != "answered" for r in rows)
    print(f"\nthe run itself: answerable kept {run_kept}, unanswerable withheld {run_withheld}")


if __name__ == "__main__":
    main()
