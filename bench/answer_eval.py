"""The answers a user reads, scored against the corpus gold (issue 28, SPEC §7).

Asks the corpus questions — CUAD (both gold files: 15 contracts, 615 questions, 260 answerable)
and FinanceBench (30 questions, plus 10 numeric questions no filing answers) — through the
product's own path (`app/service.py` `ask`, as `docqa ask` runs it) and scores each answer as
shown: right, wrong or abstained. Mechanically: a CUAD answer is right when one of its
supporting citations lies on a gold span's page and shares its words (a short span without a
page: the quote holds it); a FinanceBench answer when the text shown states a figure of the
gold answer (within 0.5 %), or, for a gold answer without figures, its key words. Any answer
shown to an unanswerable question is wrong. Verdicts read by hand (`bench/data/answers_checked.jsonl`,
`--sample` prints what to read) take precedence over the mechanical ones.

Each row of the report is one way of answering (a model, a device, free text, a server);
each question's outcome is appended to the row's jsonl (`--dir`, default bench/results/answers/)
as it comes, so a killed run resumes where it stopped. `--rejudge` takes raw answers recorded
earlier (bench/ask_eval.py's jsonl) and verifies and judges them again with today's code and a
model's yes/no verdict: the judgement measured on many answers without generating them again.
The report (`--report`) reads every row and writes, per row and per part of the corpus split
(bench/corpus_split.py: tune / held out): coverage (answerable questions answered), precision
(shown answers that are right), wrong answers shown as supported, unanswerable questions
answered. It also re-judges the recorded citations under each candidate judgement of "supports"
(the rules alone; the rules with the model's own yes/no; the yes/no alone; the rules with MiniLM
similarity), each threshold fitted on the tune questions of the same model.

The commands of the current page are COMMANDS below; on the GPU, bench/answer_eval_gpu.sh.
`--model eval` is the evaluation model (bench/eval_model.py); `--serve eval` starts `docqa serve`
with it and asks through `--model openai:…`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

from docqa.app.config import AskSettings
from docqa.app.errors import DocqaError
from docqa.app.service import Runtime, ask
from docqa.app.store import Store
from docqa.bench import ask_eval, corpus_split, eval_model
from docqa.engine.default_model import resolve_model_path
from docqa.pipelines.answer.qa import check_answer, judge
from docqa.pipelines.answer.query import content_words, stem
from docqa.pipelines.answer.support import answer_figure_quoted, figures, for_documents, need_of, unbacked
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.ingest.record import make_record
from docqa.pipelines.textnorm import normalize

ROOT = Path(__file__).resolve().parents[1]
ROWS_DIR = ROOT / "bench" / "results" / "answers"
CHECKED = ROOT / "bench" / "data" / "answers_checked.jsonl"
TARGET = 0.90  # precision of shown answers (SPEC §7)

# Numeric questions no filing answers (checked by hand: none of these businesses reports such a
# figure), so that "unanswerable answered" is measured on filings too; five per part.
UNANSWERABLE_FILING_QUESTIONS = ask_eval.UNANSWERABLE_FILING_QUESTIONS + [  # the tune part's five, then held out
    ("pdf/filing_COCACOLA_2017_10K.pdf", "How many satellites did Coca-Cola launch in 2017?"),
    ("pdf/filing_COSTCO_2021_10K.pdf", "What was Costco's revenue from oil drilling in FY2021?"),
    ("pdf/filing_MICROSOFT_2016_10K.pdf", "How many restaurants did Microsoft operate at the end of FY2016?"),
    ("pdf/filing_NETFLIX_2015_10K.pdf", "How many aircraft did Netflix own at the end of 2015?"),
    ("pdf/filing_NIKE_2018_10K.pdf", "What was Nike's revenue from cloud computing services in FY2018?"),
]


# --- the questions ---------------------------------------------------------------------------

def questions(corpus: Path) -> list[dict]:
    """Every question with its gold, part and a stable id."""
    out = []
    for g in corpus_split.cuad_questions(corpus):
        out.append(dict(id=f"cuad:{Path(g['doc_file']).stem}:{g['category']}", corpus="cuad", doc=g["doc_file"],
                        part=g["part"], question=g["question"], answerable=g["has_answer"],
                        category=g["category"], spans=[dict(text=s["text"], pages=s["pdf_pages_1based"])
                                                        for s in g["gold_spans"]]))
    for g in corpus_split.financebench_questions(corpus):
        out.append(dict(id=f"financebench:{g['financebench_id']}", corpus="financebench", doc=g["doc_file"],
                        part=g["part"], question=g["question"], answerable=True, gold_answer=g["answer"],
                        pages=g["evidence_pages_1based"]))
    for i, (doc, q) in enumerate(UNANSWERABLE_FILING_QUESTIONS):
        out.append(dict(id=f"financebench:unanswerable-{i}", corpus="financebench", doc=doc,
                        part=corpus_split.part(doc), question=q, answerable=False, gold_answer="", pages=[]))
    return out


def subset(qs: list[dict], per_contract: tuple[int, int] | None, filings: str) -> list[dict]:
    """`per_contract` (answerable, unanswerable) questions of each contract, drawn with a fixed
    seed per contract (None: all); `filings`: all, held-out, tune or none."""
    out = []
    for doc in sorted({q["doc"] for q in qs if q["corpus"] == "cuad"}):
        rows = [q for q in qs if q["doc"] == doc]
        if per_contract is None:
            out += rows
            continue
        # One generator per list, so that a larger sample holds the smaller one (a row can grow).
        ans = [q for q in rows if q["answerable"]]
        una = [q for q in rows if not q["answerable"]]
        out += random.Random(doc + ":answerable").sample(ans, min(per_contract[0], len(ans)))
        out += random.Random(doc + ":unanswerable").sample(una, min(per_contract[1], len(una)))
    keep = {"all": ("tune", "held out"), "held-out": ("held out",), "tune": ("tune",), "none": ()}[filings]
    return out + [q for q in qs if q["corpus"] == "financebench" and q["part"] in keep]


def interleaved(qs: list[dict]) -> list[dict]:
    """The questions document by document in turns (the first of each, then the second, …), so
    that the first N asked span every document and both parts."""
    by_doc: dict[str, list[dict]] = {}
    for q in qs:
        by_doc.setdefault(q["doc"], []).append(q)
    rounds = max((len(v) for v in by_doc.values()), default=0)
    return [v[i] for i in range(rounds) for v in by_doc.values() if i < len(v)]


# --- asking ------------------------------------------------------------------------------------

def ingest(store: Store, corpus: Path, docs: set[str], jobs: int = 1) -> dict[str, str]:
    """The store's id of each document, ingesting those an earlier run into the same --db did not
    (`jobs` at a time: the 10-K filings take minutes each)."""
    ids, todo = {}, []
    for rel in sorted(docs):
        try:
            ids[rel] = store.resolve(str(corpus / rel))
        except DocqaError:
            todo.append(rel)
    with ProcessPoolExecutor(jobs) if jobs > 1 and len(todo) > 1 else nullcontext() as pool:
        parsed = (pool.map if pool else map)(ingest_file, [corpus / rel for rel in todo])
        for rel, doc in zip(todo, parsed):
            print(f"ingested {rel}", file=sys.stderr, flush=True)
            store.add_record(make_record(doc))
            store.add_path(doc.doc_id, str(corpus / rel))
            ids[rel] = doc.doc_id
    return ids


def record(q: dict, run, docs: dict, wall: float) -> dict:
    """One question's outcome: the run as shown, and each citation the model wrote with what the
    judgements need (the rules' verdict, the model's log-odds), so other judgements can be scored
    on the same answers without asking again."""
    need = for_documents(need_of(q["question"]), docs.values())
    cites = []
    for role, cs in (("answer", run.citations), ("draft", run.draft_citations), ("asked", run.asked)):
        for c in cs:
            rules = judge(c, docs[c.doc_id], need).supports if c.verified else False
            cites.append(dict(role=role, page=c.span.page, quote=c.quote, verified=c.verified, supports=c.supports,
                              rules=rules, logodds=c.confirm_logodds))
    return dict(id=q["id"], status=run.status, answer=run.answer, raw=run.raw_answer, draft=run.draft,
                numeric=need.numeric, cites=cites, evidence_pages=[c.span.page for c in run.evidence],
                quote_margin=run.timings.get("quote_margin"), model=run.model, wall=round(wall, 1),
                prompt_tokens=run.timings.get("prompt_tokens"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, device: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    """`docqa serve` with `model` on a free port, ready to answer (the CLI run by this Python,
    which need not have the `docqa` script beside it)."""
    port = free_port()
    cli = "import sys; from docqa.app.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", cli, "serve", "--port", str(port), "--model", model,
                             *(["--device", device] if device else [])],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"docqa serve exited ({proc.returncode}); see {log}")
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            return proc, f"openai:{url}"
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"docqa serve did not answer within 10 minutes; see {log}")


def model_path(name: str | None) -> str | None:
    if name != "eval":
        return name
    p = eval_model.path()
    if p is None:
        raise SystemExit("the evaluation model is not assembled: .venv/bin/python bench/eval_model.py")
    return str(p)


def answered_ids(folder: Path, row: str) -> set[str]:
    """The questions a row has answered: its jsonl and its workers' (ROW.jsonl, ROW.wK.jsonl)."""
    files = [folder / f"{row}.jsonl", *folder.glob(f"{row}.w*.jsonl")]
    return {json.loads(line)["id"] for f in files if f.exists() for line in f.open()}


def run_workers(script: str, workers: int) -> int:
    """This command again as `workers` processes of `script` (`--worker K`: each its own engine,
    on its share of the questions; on a GPU they share it), waited for."""
    procs = [subprocess.Popen([sys.executable, script, *sys.argv[1:], "--worker", str(k)]) for k in range(workers)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops the workers too
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            p.terminate()


def run_row(args) -> int:
    qs = questions(args.corpus)
    per = tuple(int(x) for x in args.per_contract.split(",")) if args.per_contract else None
    todo = [q for q in subset(qs, per, args.filings) if args.part in ("all", q["part"].replace(" ", "-"))]
    todo = interleaved(todo)[:args.limit]
    args.dir.mkdir(parents=True, exist_ok=True)
    done = answered_ids(args.dir, args.row)
    todo = [q for q in todo if q["id"] not in done]
    store = Store(args.db)
    if args.worker is None:
        print(f"{args.row}: {len(done)} done, {len(todo)} to ask", file=sys.stderr, flush=True)
        ids = ingest(store, args.corpus, {q["doc"] for q in todo}, args.jobs)
        if args.workers > 1:
            return run_workers(__file__, args.workers)
    else:
        todo = todo[args.worker::args.workers]
        ids = {rel: store.resolve(str(args.corpus / rel)) for rel in {q["doc"] for q in todo}}
    out = args.dir / (f"{args.row}.jsonl" if args.worker is None else f"{args.row}.w{args.worker}.jsonl")
    server = None
    model = model_path(args.model)
    if args.serve:
        log = Path(tempfile.gettempdir()) / f"answer_eval-{args.row}.serve.log"
        server, model = start_server(model_path(args.serve), args.device, log)
    try:
        runtime = Runtime(store)
        margin = {} if args.abstain_margin is None else {"abstain_margin": args.abstain_margin}
        settings = AskSettings(model=model, quote=not args.free_text, device=args.device, **margin)
        for i, q in enumerate(todo, 1):
            t = time.perf_counter()
            run = ask(runtime, [ids[q["doc"]]], q["question"], settings)
            docs, _ = runtime.library.load([ids[q["doc"]]])
            row = dict(row=args.row, part=q["part"], corpus=q["corpus"]) | record(q, run, docs, time.perf_counter() - t)
            with out.open("a") as f:  # each answer as it comes: a killed run resumes here
                f.write(json.dumps(row) + "\n")
            print(f"[{i}/{len(todo)}] {row['status']:<11} {row['wall']:6.1f}s {q['id'][:90]}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    return 0


def rejudge(args) -> int:
    """Raw answers recorded earlier (bench/ask_eval.py's jsonl: what the model wrote) verified and
    judged again by today's code, `--model` giving its yes/no verdict on each verified quote: the
    judgement of "supports" measured on many answers without generating them again."""
    by_key = {(q["doc"], q["question"]): q for q in questions(args.corpus)}
    recorded = [json.loads(line) for f in args.rejudge for line in open(f)]
    args.dir.mkdir(parents=True, exist_ok=True)
    done = answered_ids(args.dir, args.row)
    todo = [(by_key[r["doc"], r["question"]], r) for r in recorded if (r["doc"], r["question"]) in by_key]
    order = {q["id"]: i for i, q in enumerate(interleaved([q for q, _ in todo]))}  # a part run spans every document
    todo = sorted(((q, r) for q, r in todo if q["id"] not in done), key=lambda qr: order[qr[0]["id"]])[:args.limit]
    print(f"{args.row}: {len(done)} done, {len(todo)} to judge", file=sys.stderr, flush=True)
    store = Store(args.db)
    ids = ingest(store, args.corpus, {q["doc"] for q, _ in todo}, args.jobs)
    runtime = Runtime(store)
    model = model_path(args.model)
    confirm = runtime.engine(model, args.device).confirm
    out = args.dir / f"{args.row}.jsonl"
    for i, (q, r) in enumerate(todo, 1):
        t = time.perf_counter()
        docs, passages = runtime.library.load([ids[q["doc"]]])
        answer = check_answer(q["question"], r["raw_answer"], docs, passages[ids[q["doc"]]], [], confirm=confirm)
        run = SimpleNamespace(**dict(answer), draft=answer.draft, model=str(resolve_model_path(model)))
        row = dict(row=args.row, part=q["part"], corpus=q["corpus"]) | record(q, run, docs, time.perf_counter() - t)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{i}/{len(todo)}] {row['status']:<11} {row['wall']:6.1f}s {q['id'][:90]}", file=sys.stderr, flush=True)
    return 0


# --- scoring -------------------------------------------------------------------------------------

def _words(text: str) -> set[str]:
    return {stem(w) for w in content_words(text)}


def cuad_right(q: dict, cites: list[dict]) -> bool:
    """A supporting citation on a gold span's page that shares its words (half of the shorter
    one's content words, at least two); a gold span too short to carry a page must be in the quote."""
    for c in cites:
        qn, qw = normalize(c["quote"]), _words(c["quote"])
        for s in q["spans"]:
            if not s["pages"]:
                if normalize(s["text"]) in qn:
                    return True
                continue
            if c["page"] not in s["pages"]:
                continue
            sn, sw = normalize(s["text"]), _words(s["text"])
            shared = len(qw & sw)
            if qn in sn or sn in qn or (shared >= 2 and shared >= 0.5 * min(len(qw), len(sw))):
                return True
    return False


def _figure_values(text: str) -> set[float]:
    return {f.value for f in figures(text) if f.kind != "duration"}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.005 * max(abs(a), abs(b), 1e-9)


def financebench_right(q: dict, shown: str) -> bool:
    """The shown text states a figure of the gold answer; for a gold answer without figures,
    most of its key words."""
    text = re.sub(r"\[[^\]]*\]", " ", shown)
    gold = _figure_values(q["gold_answer"])
    if gold:
        return any(_close(a, b) for a in _figure_values(text) for b in gold)
    key = _words(q["gold_answer"])
    return bool(key) and len(key & _words(text)) >= 0.6 * len(key)


def outcome(q: dict, r: dict, keep) -> tuple[str, str]:
    """(shown text or "", verdict) of a recorded answer under the judgement `keep(cite) -> bool`
    (which verified citations support it), re-deriving what the product shows as check_answer
    does: withheld without a supporting quote (or, to a numeric question, without a figure one
    holds); free text that says more than its supporting quotes shown as those quotes."""
    supporting = [c for c in r["cites"] if c["verified"] and keep(c)]
    text = r["raw"] or ""
    own = [c for c in supporting if normalize(c["quote"]) in normalize(text)]
    if supporting and not own:
        # none of the model's own quotes passes: the sentence it confirmed best is shown (qa.confirmed_sentence)
        supporting = [max(supporting, key=lambda c: c["logodds"] if c["logodds"] is not None else -99)]
        text = f'"{supporting[0]["quote"]}"'
    quotes = [c["quote"] for c in supporting]
    if not supporting or (r["numeric"] and not answer_figure_quoted(text, quotes)):
        return "", "abstained"
    if unbacked(text, quotes, q["question"]):
        text = "\n".join(f'"{c}"' for c in quotes)
    if not q["answerable"]:
        return text, "wrong"
    right = cuad_right(q, supporting) if q["corpus"] == "cuad" else financebench_right(q, text)
    return text, "right" if right else "wrong"


def as_shipped(c: dict) -> bool:
    return bool(c["supports"])


def figures_of(rows: list[tuple[dict, dict]], verdicts: list[str]) -> dict:
    ans = [v for (q, _), v in zip(rows, verdicts) if q["answerable"]]
    una = [v for (q, _), v in zip(rows, verdicts) if not q["answerable"]]
    shown = [v for v in verdicts if v != "abstained"]
    return dict(n_ans=len(ans), n_una=len(una), answered=sum(v != "abstained" for v in ans),
                right=sum(v == "right" for v in ans), shown=len(shown), shown_right=sum(v == "right" for v in shown),
                wrong=sum(v == "wrong" for v in shown), una_answered=sum(v != "abstained" for v in una))


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f} %)" if b else "–"


def table(rows: list[tuple[dict, dict]], verdict_of, label: str) -> list[str]:
    """One line per corpus × part: coverage, precision, wrong shown, unanswerable answered."""
    lines = []
    for corpus in ("cuad", "financebench"):
        cells = []
        for part in ("tune", "held out"):
            sel = [(q, r) for q, r in rows if q["corpus"] == corpus and q["part"] == part]
            f = figures_of(sel, [verdict_of(q, r) for q, r in sel])
            cells.append(f"{_pct(f['answered'], f['n_ans'])} | {_pct(f['shown_right'], f['shown'])} | "
                         f"{f['wrong']} | {_pct(f['una_answered'], f['n_una'])}")
        lines.append(f"| {label} | {'CUAD' if corpus == 'cuad' else 'FinanceBench'} | " + " | ".join(cells) + " |")
    return lines


HEADER = ["| row | questions | tune: coverage | tune: precision | tune: wrong shown | tune: unanswerable answered "
          "| held out: coverage | held out: precision | held out: wrong shown | held out: unanswerable answered |",
          "| --- | --- |" + " --- |" * 8]


def load_rows(corpus: Path, folder: Path) -> dict[str, list[tuple[dict, dict]]]:
    """Every recorded answer of every row in `folder`, by the row it names (a row's workers
    write files of their own)."""
    by_id = {q["id"]: q for q in questions(corpus)}
    out: dict[str, list[tuple[dict, dict]]] = {}
    for f in sorted(folder.glob("*.jsonl")):
        for r in map(json.loads, f.open()):
            if r["id"] in by_id:
                out.setdefault(r["row"], []).append((by_id[r["id"]], r))
    return out


def checked() -> dict[tuple[str, str, str], str]:
    """Verdicts read by hand: (row, question id, judgement) -> right / wrong, where the judgement
    is the one that showed the answer ("shipped": what the product showed; "rules only")."""
    if not CHECKED.exists():
        return {}
    return {(c["row"], c["id"], c["judgement"]): c["verdict"] for c in map(json.loads, CHECKED.open())}


JUDGEMENTS = {"shipped": lambda c: bool(c["supports"]), "rules only": lambda c: c["rules"]}


def threshold_on_tune(tune, score, keep_rule, candidates) -> float:
    """The least threshold whose shown answers on the tune part meet the precision target,
    answers shown = rules pass and score >= threshold; infinity (nothing shown) when none does:
    precision first."""
    for t in sorted(candidates):
        vs = [outcome(q, r, lambda c: keep_rule(c) and score(q, c) >= t)[1] for q, r in tune]
        shown = [v for v in vs if v != "abstained"]
        if shown and sum(v == "right" for v in shown) >= TARGET * len(shown):
            return t
    return math.inf


def report(args) -> int:
    all_rows = load_rows(args.corpus, args.dir)
    hand = checked()
    lines = ["# Answers a user reads, scored against the corpus gold", "",
             "Commands (each row resumes from its own jsonl in `bench/results/answers/`):", ""]
    lines += [f"    {c}" for c in COMMANDS] + [""]
    lines += ["Coverage: answerable questions answered; precision: shown answers that are right (the "
              "target is ≥ 90 %); wrong shown: wrong answers shown as supported; unanswerable answered: "
              "answers shown to questions the document does not answer. Scored mechanically, "
              f"except where a verdict was read by hand ({len(hand)} in `bench/data/answers_checked.jsonl`).", ""]
    lines += HEADER
    for name, rows in all_rows.items():
        def shipped(q, r, name=name):
            v = outcome(q, r, as_shipped)[1]
            return hand.get((name, q["id"], "shipped"), v) if v != "abstained" else v
        lines += table(rows, shipped, f"{name} ({len(rows)})")
    lines += ["", *judgements(all_rows), "", *agreement(all_rows, hand), "", *consistency(all_rows)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def judgements(all_rows) -> list[str]:
    """Each candidate judgement of "supports", re-scored on the recorded answers; thresholds
    chosen on the tune part only."""
    from docqa.engine.config import CheckpointError
    from docqa.engine.models.bert import load_minilm

    try:
        enc = load_minilm()
    except CheckpointError:  # not installed (the GPU machine): that candidate is left out
        enc = None
    pairs = sorted({(q["question"], c["quote"]) for rows in all_rows.values() for q, r in rows for c in r["cites"]
                    if c["verified"]})
    sim = {}
    if pairs and enc is not None:
        qe = enc.encode([p[0] for p in pairs])
        ce = enc.encode([p[1] for p in pairs])
        sim = {p: float(a @ b) for p, a, b in zip(pairs, qe, ce)}
    lines = ["## Which judgement of \"supports\" meets the target",
             "",
             "Every recorded citation re-judged; the threshold of each scored judgement is the least that "
             "meets 90 % precision on the tune part (none: nothing is shown), then reported on both parts. "
             "\"rules only\" is the rules of `pipelines/answer/support.py` with no threshold; when they miss "
             "the target it is reported as they are.",
             "", *HEADER]
    for name, rows in all_rows.items():
        model = Path(rows[0][1]["model"]).name
        # each threshold is fitted on the tune questions of every row of the same model (file name:
        # the GPU machine keeps it elsewhere)
        tune = [(q, r) for other in all_rows.values() for q, r in other
                if Path(r["model"]).name == model and q["part"] == "tune"]
        logodds = [round(c["logodds"] * 4) / 4 for q, r in tune for c in r["cites"] if c.get("logodds") is not None]
        cands = [("rules only", lambda q, c: 0.0, lambda c: c["rules"], [0.0])]
        if logodds:
            cands.append(("rules + model yes/no", lambda q, c: c["logodds"] if c["logodds"] is not None else -99,
                          lambda c: c["rules"], sorted(set(logodds))))
            cands.append(("model yes/no alone", lambda q, c: c["logodds"] if c["logodds"] is not None else -99,
                          lambda c: True, sorted(set(logodds))))
        sims = sorted({round(v, 2) for v in sim.values()})
        if sims:
            cands.append(("rules + MiniLM", lambda q, c: sim.get((q["question"], c["quote"]), -1.0),
                          lambda c: c["rules"], sims))
        for label, score, rule, grid in cands:
            t = threshold_on_tune(tune, score, rule, grid) if len(grid) > 1 else grid[0]
            verdict = lambda q, r, t=t, score=score, rule=rule: outcome(q, r, lambda c: rule(c) and score(q, c) >= t)[1]
            at = " (none meets the target on tune: nothing shown)" if t == math.inf else f" ≥ {t:.2f}" if len(grid) > 1 else ""
            lines += table(rows, verdict, f"{name}: {label}{at}")
    return lines


def agreement(all_rows, hand) -> list[str]:
    """How often the mechanical verdict agrees with the one read by hand."""
    n = agree = 0
    for name, rows in all_rows.items():
        for q, r in rows:
            for judgement, keep in JUDGEMENTS.items():
                if (name, q["id"], judgement) in hand:
                    n += 1
                    agree += outcome(q, r, keep)[1] == hand[name, q["id"], judgement]
    return [f"Hand-checked shown answers: {n}; the mechanical verdict agrees on {agree}."]


def consistency(all_rows) -> list[str]:
    """The re-derivation used above against what the product showed: they must agree."""
    off = [(name, q["id"]) for name, rows in all_rows.items() for q, r in rows
           if (outcome(q, r, as_shipped)[1] == "abstained") != (r["status"] != "answered")]
    return [f"Re-derived shown/withheld equals the product's status on every recorded answer: "
            f"{'yes' if not off else 'no, ' + str(len(off)) + ' differ: ' + ', '.join(i for _, i in off[:5])}."]


def sample(args) -> int:
    """Shown answers to read by hand: `--sample N` of a row under `--judgement`, not yet checked,
    as jsonl lines to judge (add "verdict") and append to bench/data/answers_checked.jsonl."""
    rows = load_rows(args.corpus, args.dir)[args.row]
    hand, keep = checked(), JUDGEMENTS[args.judgement]
    shown = [(q, r) for q, r in rows
             if (args.row, q["id"], args.judgement) not in hand and outcome(q, r, keep)[1] != "abstained"]
    for q, r in random.Random(0).sample(shown, min(args.sample, len(shown))):
        text, v = outcome(q, r, keep)
        gold = q.get("gold_answer") or " / ".join(f"{s['text'][:200]} (p. {s['pages']})" for s in q.get("spans", []))
        print(json.dumps(dict(row=args.row, id=q["id"], judgement=args.judgement, mechanical=v,
                              question=q["question"][-160:], gold=gold, shown=text[:600],
                              pages=[c["page"] for c in r["cites"] if c["verified"] and keep(c)])))
    return 0


COMMANDS = [
    ".venv/bin/python bench/answer_eval.py --row default-rejudged --db /tmp/rejudge.db --rejudge "
    "bench/results/ask_all_2026-11-30-s4.jsonl bench/results/ask_financebench.jsonl",
    ".venv/bin/python bench/answer_eval.py --row eval-rejudged --model eval --db /tmp/rejudge.db --rejudge "
    "bench/results/ask_all_2026-11-30-s4.jsonl bench/results/ask_financebench.jsonl",
    ".venv/bin/python bench/answer_eval.py --row default --per-contract 1,1 --filings none --part held-out",
    ".venv/bin/python bench/answer_eval.py --row eval-cpu --model eval --per-contract 1,1 --filings none --part tune",
    ".venv/bin/python bench/answer_eval.py --row eval-cpu --model eval --per-contract 2,1 --filings none --part held-out",
    "bash bench/answer_eval_gpu.sh      # on the H200 (rows eval-gpu, default-gpu, free-text-gpu, server-gpu)",
    ".venv/bin/python bench/answer_eval.py --report --out bench/results/answers.md",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--row", help="the row's name: its answers go to bench/results/answers/ROW.jsonl")
    ap.add_argument("--dir", type=Path, default=ROWS_DIR,
                    help="the folder of the rows' jsonl files (default bench/results/answers)")
    ap.add_argument("--model", default=None, help="a checkpoint, openai:URL, or eval (the evaluation model)")
    ap.add_argument("--serve", default=None, help="start `docqa serve` with this model (or eval) and ask through it")
    ap.add_argument("--device", default=None)
    ap.add_argument("--free-text", action="store_true")
    ap.add_argument("--abstain-margin", type=float, default=None,
                    help="AskSettings.abstain_margin (default: the product's); -inf always quotes, so "
                         "the report can fit the margin afterwards from each answer's recorded quote_margin")
    ap.add_argument("--per-contract", default=None, metavar="A,U",
                    help="A answerable and U unanswerable questions per contract (default: all)")
    ap.add_argument("--filings", default="all", choices=("all", "held-out", "tune", "none"))
    ap.add_argument("--part", default="all", choices=("all", "tune", "held-out"), help="only this part's questions")
    ap.add_argument("--limit", type=int, default=None, help="only the first N, taken document by document in turns")
    ap.add_argument("--db", default="/tmp/docqa-answer-eval.db")
    ap.add_argument("--jobs", type=int, default=1, help="documents ingested at a time")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes asking at once, each with its own engine (on a GPU: they share it)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, default=corpus_split.CORPUS)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--rejudge", nargs="+", type=Path, default=None, metavar="JSONL",
                    help="judge the raw answers recorded in these jsonl again, as --row, with --model's verdict")
    ap.add_argument("--sample", type=int, default=0, help="print N shown answers of --row to check by hand")
    ap.add_argument("--judgement", default="shipped", choices=sorted(JUDGEMENTS), help="which answers --sample reads")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.report:
        return report(args)
    if args.sample:
        return sample(args)
    if not args.row:
        ap.error("give --row (or --report)")
    if args.rejudge:
        return rejudge(args)
    return run_row(args)


if __name__ == "__main__":
    sys.exit(main())
