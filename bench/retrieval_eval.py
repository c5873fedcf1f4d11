"""Evidence retrieval on the CUAD gold of the corpus's fifteen contracts: is a gold page
among the first 1/3/5 distinct pages that `docqa ask --evidence-only` shows?

Every answerable gold record whose spans carry PDF pages (both gold files,
`bench/corpus_split.cuad_questions`) is asked of its contract; the ranked passages of
`pipelines.answer.retrieval` become distinct evidence pages (`evidence_passages`, as
citations show them). Recall@1/3/5 is reported per corpus part — "tune" (the documents rules
and weights were fitted on) and "held out" (never looked at for fitting) — for the product
(lexical signals fused with dense retrieval, the body ranked before exhibits), for the
lexical signals alone, for dense retrieval alone, and for the product without each signal;
then, per kind of question (a figure, a business fact, a clause), the hits at each dense
weight: the grid the product's one weight was chosen from, on the tuning part.

    .venv/bin/python bench/retrieval_eval.py [--cache DIR] [--no-dense] [--out FILE]

`--cache DIR` keeps the parsed contracts (keyed by the source of the ingest pipeline, so a
parser change re-parses) and every passage vector (keyed by the text embedded and the
encoder), so a re-run neither re-parses nor re-encodes. Passage vectors are made as ingest
makes them (`ingest.passages.passage_vectors`, the torch encoder); questions are embedded as
`docqa ask` embeds them (`bert_numpy`). The report ends with a `Figures` line: the newest one
in bench/results/retrieval.md is what tests/test_retrieval.py holds the product to
(`expected()`), among them the lexical recall on the six smallest contracts (`SMALL`), which
the default test run checks in a few seconds. `bench/filings_eval.py` runs the same machinery
on the 10-K filings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from docqa.bench.corpus_split import cuad_questions
from docqa.pipelines.answer.memory_fts import MemoryFts, MemoryPageFts
from docqa.pipelines.answer.figures import analyze_figures
from docqa.pipelines.answer.retrieval import WEIGHTS, Dense, evidence_passages, fuse, rank, signals
from docqa.pipelines.document import Document, Encoder, Passage
from docqa.pipelines.ingest.passages import make_passages, passage_titles, passage_vectors, vector_texts, vectors_name

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
RESULTS = ROOT / "bench" / "results" / "retrieval.md"
FIGURES = "Figures (recall@5; the regression floors): "
EVIDENCE = 5  # distinct pages shown as evidence (AskSettings.evidence)
POOL = 40  # passages retrieved, as app.service's EVIDENCE_POOL
KS = (1, 3, 5)
PARTS = ("tune", "held out")
# What a parsed document is made by (passages and vectors are made on every run, from it):
# a change to any of these parses again.
PIPELINE_SOURCES = ("pipelines/document.py", "pipelines/textnorm.py", "pipelines/ingest/*.py")
NOT_PARSING = ("passages.py", "record.py")


def pipeline_hash() -> str:
    h = hashlib.sha256()
    for pattern in PIPELINE_SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            if path.name not in NOT_PARSING:
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def load_corpus(pattern: str, cache: Path | None) -> dict[str, Document]:
    """{file name: Document} for the corpus PDFs matching `pattern`, parsed as ingest parses
    them; with `cache`, each document is parsed once per version of the pipeline."""
    from docqa.pipelines.ingest.build import ingest_file

    docs = {}
    for f in sorted((CORPUS / "pdf").glob(pattern)):
        pkl = cache / "docs" / f"{f.stem}-{pipeline_hash()}.pkl" if cache else None
        if pkl and pkl.exists():
            docs[f.name] = pickle.loads(pkl.read_bytes())
            continue
        t = time.perf_counter()
        docs[f.name] = ingest_file(f)
        print(f"parsed {f.name}: {len(docs[f.name].pages)} pages in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        if pkl:
            pkl.parent.mkdir(parents=True, exist_ok=True)
            pkl.write_bytes(pickle.dumps(docs[f.name]))
    return docs


# The six smallest contracts (10-22 pages; three tune, three held out): the default test
# run's cut-down case.
SMALL = ("contract_BellringBrandsInc_*", "contract_LIMEENERGYCO_*", "contract_MEDIWOUNDLTD_*",
         "contract_MJBIOTECH_INC_*", "contract_Quaker_Chemical_*", "contract_VirtuosoSurgicalInc_*")


def load_docs(cache: Path | None = None, small: bool = False) -> dict[str, Document]:
    if small:
        return {name: doc for pattern in SMALL for name, doc in load_corpus(pattern + ".pdf", cache).items()}
    return load_corpus("contract_*.pdf", cache)


def is_small(doc_file: str) -> bool:
    return any(Path(doc_file).match(pattern + ".pdf") for pattern in SMALL)


class VectorCache:
    """Passage vectors made as ingest makes them, kept in `folder` (one .npy per document and
    encoder, keyed by a hash of the texts embedded) when given."""

    def __init__(self, encoder: Encoder, folder: Path | None):
        self.encoder, self.folder = encoder, folder
        self.encoded = 0  # passages encoded in this process
        self.seconds = 0.0

    def vectors(self, doc: Document, passages: Sequence[Passage]) -> np.ndarray:
        titles = passage_titles(doc.sections, passages)
        h = hashlib.sha256(vectors_name(self.encoder).encode())
        for text in vector_texts(passages, titles):
            h.update(text.encode() + b"\0")
        path = self.folder / f"{h.hexdigest()[:20]}.npy" if self.folder else None
        if path and path.exists():
            return np.load(path)
        t = time.perf_counter()
        matrix = passage_vectors(passages, titles, self.encoder).matrix
        self.seconds += time.perf_counter() - t
        self.encoded += len(passages)
        print(f"encoded {len(passages)} passages of {Path(doc.path).name} in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, matrix)
        return matrix


def dense_index(docs: Mapping[str, Document], passages: Mapping[str, Sequence[Passage]],
                cache: Path | None) -> tuple[Dense, VectorCache]:
    """The documents' passage vectors (made, or read from the cache) and the question encoder."""
    from docqa.engine.models.bert import load_minilm
    from docqa.engine.models.bert_numpy import load_question_encoder

    vc = VectorCache(load_minilm(), cache / "vectors" if cache else None)
    vectors = {d: vc.vectors(doc, passages[d]) for d, doc in docs.items()}
    return Dense(vectors, load_question_encoder()), vc


# --------------------------------------------------------------------------------------
# Methods: each turns a question's signals into a ranking (passage keys, best first).

Method = Callable[[dict], list]


def ranked(row: dict, weights: Mapping[str, float] | None = None) -> list:
    """The question's passages as `retrieve()` orders them (`retrieval.rank`), under `weights`
    (None: the product's)."""
    return [k for k, _ in rank(row["question"], row["docs"], row["passages"], row["sig"], weights)]


def weighted(weights: Mapping[str, float]) -> Method:
    return lambda row: ranked(row, weights)


def product(row: dict) -> list:
    return ranked(row)


def without(name: str) -> Method:
    return weighted({**WEIGHTS, name: 0.0})


lexical = without("dense")


def exhibits_in_place(row: dict) -> list:
    """The product's fusion with exhibits left where the signals rank them."""
    return [k for k, _ in fuse(row["sig"], WEIGHTS)]


FINAL, LEXICAL = "product: lexical + dense, body before exhibits", "lexical signals alone (product without dense)"


def methods(signal_names: Sequence[str]) -> dict[str, Method]:
    out = {FINAL: product, LEXICAL: lexical, "dense alone": weighted({"dense": 1.0}),
           "bm25 + thesaurus alone": weighted({"bm25_terms": 1.0}),
           "product with exhibits where they rank": exhibits_in_place}
    for name in signal_names:
        if name not in ("dense", "bm25_plain"):
            out[f"product without {name}"] = without(name)
    return out


def kind(row: dict) -> str:
    """What a question asks: a figure (`figures.analyze_figures`), a clause (a CUAD question
    that asks none), or a business fact (a filing question that asks none)."""
    if analyze_figures(row["question"]).wanted:
        return "figure"
    return "clause" if "category" in row["g"] else "business fact"


DENSE_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)


def kind_grid(rows: Sequence[dict]) -> list[str]:
    """Hits@1/3/5 per kind of question and corpus part at each dense weight (the other
    weights as the product's): whether questions of one kind want another weight."""
    lines = ["| kind | part | n | " + " | ".join(f"dense {w:g}" for w in DENSE_GRID) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in DENSE_GRID) + " |"]
    for k in ("figure", "business fact", "clause"):
        for part in PARTS:
            sel = [r for r in rows if kind(r) == k and r["part"] == part]
            if not sel:
                continue
            cells = []
            for w in DENSE_GRID:
                hits = [0, 0, 0]
                for r in sel:
                    shown = pages_of(ranked(r, {**WEIGHTS, "dense": w}), r["by_key"])
                    for i, n in enumerate(KS):
                        hits[i] += bool(r["gold"] & set(shown[:n]))
                cells.append("/".join(map(str, hits)))
            lines.append(f"| {k} | {part} | {len(sel)} | " + " | ".join(cells) + " |")
    return lines


def pages_of(ranking: Sequence, by_key: Mapping, k: int = EVIDENCE) -> list[int]:
    """The evidence pages a ranking shows: its first `k` distinct pages."""
    return [p.span.page for p in evidence_passages([by_key[key] for key in ranking if key in by_key], k)]


# --------------------------------------------------------------------------------------
# Running the questions


def run(questions: Sequence[dict], docs_by_file: Mapping[str, Document], dense_cache: Path | None | bool) -> dict:
    """Every question's signals (dense too unless `dense_cache` is False) and gold pages,
    with the product's retrieval time per question (warm, in-memory indexes)."""
    docs = {d.doc_id: d for d in docs_by_file.values()}
    passages = {d: make_passages(doc) for d, doc in docs.items()}
    fts, page_fts = MemoryFts(passages, docs), MemoryPageFts(docs)
    dense = vc = None
    if dense_cache is not False:
        dense, vc = dense_index(docs, passages, dense_cache or None)
    rows = []
    for g in questions:
        doc = docs_by_file[Path(g["doc_file"]).name]
        one, ps = {doc.doc_id: doc}, {doc.doc_id: passages[doc.doc_id]}
        t = time.perf_counter()
        sig = signals(g["question"], one, ps, fts=fts, page_fts=page_fts, dense=dense)
        rank(g["question"], one, ps, sig)
        latency = time.perf_counter() - t
        rows.append({"g": g, "question": g["question"], "docs": one, "passages": ps, "part": g["part"], "sig": sig,
                     "gold": set(g["gold_pages"]), "by_key": {(doc.doc_id, p.index): p for p in ps[doc.doc_id]},
                     "latency": latency})
    out = {"rows": rows, "n_passages": sum(len(ps) for ps in passages.values())}
    if vc is not None and vc.encoded:
        out["encoding"] = (vc.encoded, vc.seconds)
    return out


def recall(rows: Sequence[dict], method: Method) -> dict[str, dict[int, float]]:
    """Per part (and "all"): the share of questions with a gold page among the first 1/3/5
    evidence pages, and the count at 5."""
    out = {}
    for part in (*PARTS, "all"):
        sel = [r for r in rows if part == "all" or r["part"] == part]
        hits = {k: 0 for k in KS}
        for r in sel:
            shown = pages_of(method(r), r["by_key"])
            for k in KS:
                hits[k] += bool(r["gold"] & set(shown[:k]))
        out[part] = {**{k: hits[k] / len(sel) if sel else 0.0 for k in KS}, "n": len(sel), "hits5": hits[5]}
    return out


def cuad_gold() -> list[dict]:
    """Answerable CUAD records whose spans carry pages, with `gold_pages`."""
    out = []
    for g in cuad_questions():
        pages = sorted({p for s in g["gold_spans"] for p in (s["pdf_pages_1based"] or [])})
        if g["has_answer"] and pages:
            out.append({**g, "gold_pages": pages})
    return out


def evaluate(docs_by_file: Mapping[str, Document] | None = None, cache: Path | None = None,
             dense: bool = True) -> dict:
    docs_by_file = docs_by_file or load_docs(cache)
    qs = [g for g in cuad_gold() if Path(g["doc_file"]).name in docs_by_file]
    res = run(qs, docs_by_file, (cache or True) if dense else False)
    rows = res["rows"]
    names = sorted({n for r in rows for n in r["sig"]})
    res["recall"] = {name: recall(rows, m) for name, m in methods(names).items()
                     if dense or name != "dense alone"}
    return res


def misses(rows: Sequence[dict], method: Method, part: str) -> list[str]:
    out = []
    for r in rows:
        if r["part"] != part:
            continue
        shown = pages_of(method(r), r["by_key"])
        if not r["gold"] & set(shown):
            g = r["g"]
            what = g.get("category") or g["question"][:70]
            out.append(f"{what} ({Path(g['doc_file']).stem[:40]}): gold pages {sorted(r['gold'])[:6]}, shown {shown}")
    return out


def figures(res: dict) -> dict[str, float]:
    """recall@5 per part of the product and of its lexical signals alone, and the lexical
    one on the small contracts: what the regression tests hold the product to."""
    out = {}
    for label, name in (("product", FINAL), ("lexical", LEXICAL)):
        for part in PARTS:
            out[f"{label} {part}"] = round(res["recall"][name][part][5], 3)
    small = [r for r in res["rows"] if is_small(r["g"]["doc_file"])]
    out["lexical small contracts"] = round(recall(small, lexical)["all"][5], 3)
    return out


def expected(path: Path = RESULTS) -> dict[str, float]:
    """The figures of the newest run written to the results file (its first `Figures` line,
    which `report()` prints): the floors come from the measurement, not from a copy of it."""
    for line in path.read_text().splitlines():
        if line.startswith(FIGURES):
            return json.loads(line[len(FIGURES):])
    raise ValueError(f"{path} has no {FIGURES.strip()!r} line: run this benchmark and add its report")


def recall_table(res: dict) -> list[str]:
    lines = ["| method | tune @1 / @3 / @5 | held out @1 / @3 / @5 | all @5 |", "| --- | --- | --- | --- |"]
    for name, rec in res["recall"].items():
        cells = [" / ".join(f"{rec[part][k]:.3f}" for k in KS) + f" ({rec[part]['hits5']}/{rec[part]['n']})"
                 if rec[part]["n"] else "—" for part in PARTS]
        mark = " **(final)**" if name == FINAL else ""
        lines.append(f"| {name}{mark} | {cells[0]} | {cells[1]} | {rec['all'][5]:.3f} |")
    return lines


def timing_lines(res: dict) -> list[str]:
    lat = sorted(r["latency"] for r in res["rows"])
    lines = [f"retrieval per question (question analysis and embedding, every signal, fusion; one document, "
             f"warm, in-memory indexes): median {statistics.median(lat) * 1000:.0f} ms, "
             f"max {lat[-1] * 1000:.0f} ms over {len(lat)} questions, {res['n_passages']} passages"]
    if "encoding" in res:
        n, s = res["encoding"]
        lines.append(f"passage encoding (this run, not cached): {n} passages in {s:.0f} s = {n / s:.1f} passages/s")
    return lines


def report(res: dict) -> str:
    rows = res["rows"]
    n = {part: sum(r["part"] == part for r in rows) for part in PARTS}
    lines = [f"{len(rows)} answerable CUAD questions with gold pages on {len({r['g']['doc_file'] for r in rows})} "
             f"contracts: {n['tune']} tune, {n['held out']} held out", "", *recall_table(res), "", *timing_lines(res)]
    if "dense alone" in res["recall"]:
        lines += ["", "hits@1/3/5 by kind of question and dense weight (the product's other weights):", "",
                  *kind_grid(rows)]
    for part in PARTS:
        lines += ["", f"misses at 5 ({part}, final method):", *[f"- {m}" for m in misses(rows, product, part)]]
    lines += ["", FIGURES + json.dumps(figures(res), sort_keys=True)]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# What vectors cost: ingest with and without them, and an evidence-only question, through
# the CLI a user runs.


def _child_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _cli(args: list[str]) -> tuple[float, float, str]:
    """(CPU s of the child, wall s, stdout) of one `docqa` command in a fresh process."""
    import subprocess

    cpu, t = _child_cpu(), time.perf_counter()
    docqa = Path(sys.executable).parent / "docqa"  # the console script beside this interpreter
    done = subprocess.run([str(docqa), *args], capture_output=True, text=True, check=True)
    return _child_cpu() - cpu, time.perf_counter() - t, done.stdout


def cost(pdf: Path, questions: Sequence[str], rounds: int = 2) -> list[str]:
    """Ingest cost of passage vectors on one PDF (in process, CPU seconds, the parse and the
    vectors alternated `rounds` times: pages/s without and with them), then `docqa ingest` and
    `docqa ask --evidence-only` on it through the CLI (CPU of the child process, wall)."""
    import tempfile

    import torch
    from docqa.engine.models.bert import load_minilm
    from docqa.pipelines.ingest.build import build
    from docqa.pipelines.ingest.source import load

    t = time.process_time()
    encoder = load_minilm()
    load_s = time.process_time() - t
    parse, encode = [], []
    for _ in range(rounds):
        t = time.process_time()
        doc = build(load(pdf))
        passages = make_passages(doc)
        parse.append(time.process_time() - t)
        t = time.process_time()
        passage_vectors(passages, passage_titles(doc.sections, passages), encoder)
        encode.append(time.process_time() - t)
    n_pages, n = len(doc.pages), len(passages)
    p, e = min(parse), min(encode)
    t = time.process_time()
    fp32 = passage_vectors(passages, passage_titles(doc.sections, passages), load_minilm(dtype=torch.float32))
    e32 = time.process_time() - t
    from docqa.engine.models.bert_numpy import load_question_encoder

    question = load_question_encoder()
    t = time.process_time()
    for q in questions:
        question.encode([q])
    embed_ms = (time.process_time() - t) / max(len(questions), 1) * 1000
    t = time.process_time()
    for _ in range(100):
        fp32.matrix @ fp32.matrix[0]
    search_ms = (time.process_time() - t) * 10
    lines = [f"{pdf.name}: {n_pages} pages, {n} passages; encoder {encoder.dtype}, {torch.get_num_threads()} "
             f"thread(s), loaded in {load_s:.1f} s CPU",
             f"- in process (CPU s, best of {rounds}): parse and structure {p:.1f} s = {n_pages / p:.2f} pages/s; "
             f"vectors {e:.1f} s = {n / e:.1f} passages/s; with vectors {n_pages / (p + e):.2f} pages/s "
             f"({(p + e) / p:.2f}x the time); vectors in fp32 instead: {e32:.1f} s = {n / e32:.1f} passages/s",
             f"- per question: embedding (numpy, one thread) {embed_ms:.0f} ms; exact search over the {n} "
             f"vectors {search_ms:.2f} ms"]
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "cost.db")
        cpu, wall, out = _cli(["ingest", str(pdf), "--db", db, "--json"])
        doc_id = json.loads(out)[0]["doc_id"]
        lines.append(f"- `docqa ingest` (with vectors): {cpu:.1f} s CPU ({n_pages / cpu:.2f} pages/s), {wall:.1f} s wall")
        cpus, walls, own = [], [], []
        for q in questions:
            cpu, wall, out = _cli(["ask", doc_id, q, "--evidence-only", "--json", "--db", db])
            cpus.append(cpu)
            walls.append(wall)
            own.append(json.loads(out)["timings"]["retrieve_s"])
        if questions:
            med = statistics.median
            lines.append(f"- `docqa ask --evidence-only`, {len(questions)} questions: CPU median {med(cpus):.2f} s, "
                         f"max {max(cpus):.2f} s; wall median {med(walls):.2f} s; retrieval itself "
                         f"(`timings.retrieve_s`) median {med(own):.2f} s, max {max(own):.2f} s")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None, help="keep parsed contracts and passage vectors here")
    ap.add_argument("--no-dense", action="store_true", help="lexical signals only (no encoder)")
    ap.add_argument("--cost", type=Path, default=None, metavar="PDF",
                    help="instead: what passage vectors cost on this contract (ingest, evidence-only ask)")
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.cost:
        qs = [g["question"] for g in cuad_gold() if Path(g["doc_file"]).name == args.cost.name][:10]
        text = "\n".join(cost(args.cost, qs))
    else:
        text = report(evaluate(cache=args.cache, dense=not args.no_dense))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
