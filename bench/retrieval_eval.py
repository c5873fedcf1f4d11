"""Evidence retrieval on the CUAD gold subset: is a gold page among the top-k cited pages?

For each answerable question whose gold spans carry PDF pages, the ranked passages of
`pipelines.retrieval` are turned into distinct pages (as citations show them) and recall@1/3/5
is the share of questions with a gold page among the first 1/3/5. Each method is a set of
signal weights, so every component is measured alone and in the fusion. The 50 unanswerable
questions show what the top scores look like when nothing answers (for a "not found" cut).

    .venv/bin/python bench/retrieval_eval.py [--embeddings] [--cache DIR] [--out FILE]

`--cache` keeps parsed documents and passage embeddings between runs (pickle/npz).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from docqa.pipelines.passages import make_passages
from docqa.pipelines.query import analyze
from docqa.pipelines.retrieval import (
    WEIGHTS,
    EmbeddingCache,
    MemoryFts,
    _bm25,
    fuse,
    passages_key,
    signals,
)

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
GOLD = CORPUS / "qa" / "cuad_gold_subset_3contracts.jsonl"

# What this benchmark measured for the final method (bench/results/retrieval.md); the
# regression test allows a small margin below these.
EXPECTED = {"lexical fused": 0.866, "all fused": 0.851}

METHODS: dict[str, dict[str, float]] = {
    "bm25, text only (question words; the lead's baseline)": {"bm25_text_only": 1.0},
    "bm25 text + titles column (question words)": {"bm25_plain": 1.0},
    "bm25 + thesaurus": {"bm25_terms": 1.0},
    "bm25 + thesaurus + focus": {"bm25_terms": 1.0, "bm25_focus": 1.0},
    "section titles alone": {"titles": 1.0},
    "lexical fused": {k: v for k, v in WEIGHTS.items() if k != "embedding"},
    # Leave-one-out: what each lexical component adds to the final method.
    "final without thesaurus": {**{k: v for k, v in WEIGHTS.items() if k not in ("embedding", "bm25_terms")},
                                "bm25_plain": 1.0},
    "final without focus query": {k: v for k, v in WEIGHTS.items() if k not in ("embedding", "bm25_focus")},
    "final without titles signal": {k: v for k, v in WEIGHTS.items() if k not in ("embedding", "titles")},
    "final without definitions": {k: v for k, v in WEIGHTS.items() if k not in ("embedding", "definitions")},
    "final without preamble": {k: v for k, v in WEIGHTS.items() if k not in ("embedding", "preamble")},
    "embeddings alone": {"embedding": 1.0},
    "bm25 (question words) + embeddings": {"bm25_plain": 1.0, "embedding": 1.0},
    "all fused": dict(WEIGHTS),
}


def load_docs(cache: Path | None):
    from docqa.pipelines.ingest import ingest_file

    pkl = cache / "docs.pkl" if cache else None
    if pkl and pkl.exists():
        return pickle.loads(pkl.read_bytes())
    docs = {}
    for f in sorted((CORPUS / "pdf").glob("contract_*.pdf")):
        docs[f.name] = ingest_file(f)
    if pkl:
        pkl.parent.mkdir(parents=True, exist_ok=True)
        pkl.write_bytes(pickle.dumps(docs))
    return docs


class NpzStore(dict):
    """Passage vectors kept on disk between benchmark runs."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path = path
        if path and path.exists():
            with np.load(path) as z:
                self.update({k: z[k] for k in z.files})

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if self.path:
            np.savez(self.path, **self)


def pages_of(order, by_key, k=5):
    pages = []
    for key, _ in order:
        pg = by_key[key].page
        if pg not in pages:
            pages.append(pg)
            if len(pages) == k:
                break
    return pages


def evaluate(encoder=None, cache: Path | None = None, docs_by_file=None) -> dict:
    """Recall@1/3/5 per method over the answerable gold questions with pages, plus
    latencies and top-score distributions. `encoder` is a `BertEncoder` (or None)."""
    docs_by_file = docs_by_file or load_docs(cache)
    gold = [json.loads(line) for line in GOLD.open()]
    passages = {d.doc_id: make_passages(d) for d in docs_by_file.values()}
    fts = MemoryFts(passages, {d.doc_id: d for d in docs_by_file.values()})
    fts_text = MemoryFts(passages)

    out: dict = {}
    cached = None
    if encoder is not None:
        store = NpzStore(cache / f"emb_{encoder.max_length}.npz" if cache else None)
        cached = EmbeddingCache(encoder, store)
        missing = [ps for ps in passages.values() if passages_key(ps) not in store]
        n = sum(len(ps) for ps in missing)
        if n:
            t = time.perf_counter()
            for ps in missing:
                cached.passage_vectors(ps)
            dt = time.perf_counter() - t
            out["encode_passages_per_s"] = n / dt
            out["encode_note"] = f"passage encoding: {n} passages in {dt:.1f} s = {n / dt:.1f} passages/s"

    rows = []
    for g in gold:
        doc = docs_by_file[Path(g["doc_file"]).name]
        one = {doc.doc_id: doc}
        ps = {doc.doc_id: passages[doc.doc_id]}
        t = time.perf_counter()
        fused = fuse(signals(g["question"], one, ps, fts=fts), METHODS["lexical fused"])
        latency = time.perf_counter() - t
        t = time.perf_counter()
        sig = signals(g["question"], one, ps, fts=fts, encoder=cached, extra=True)
        latency_all = time.perf_counter() - t
        sig["bm25_text_only"] = _bm25(fts_text, analyze(g["question"]).terms, [doc.doc_id])
        pages = set()
        for s in g["gold_spans"]:
            pages |= set(s["pdf_pages_1based"] or [])
        by_key = {(doc.doc_id, p.index): p for p in passages[doc.doc_id]}
        rows.append({"g": g, "pages": pages, "sig": sig, "fused": fused, "by_key": by_key, "latency": latency,
                     "latency_all": latency_all})

    answerable = [r for r in rows if r["g"]["has_answer"] and r["pages"]]
    final = "lexical fused"
    recall, misses = {}, []
    for name, w in METHODS.items():
        if "embedding" in w and cached is None:
            continue
        hits = {1: 0, 3: 0, 5: 0}
        for r in answerable:
            top = pages_of(fuse(r["sig"], w), r["by_key"])
            for k in hits:
                hits[k] += bool(r["pages"] & set(top[:k]))
            if name == final and not r["pages"] & set(top[:5]):
                g = r["g"]
                misses.append(f"{g['category']} ({Path(g['doc_file']).name[9:25]}): gold pages "
                              f"{sorted(r['pages'])[:6]}, cited {top}")
        recall[name] = {k: v / len(answerable) for k, v in hits.items()}
    out.update(n=len(answerable), n_answerable=sum(r["g"]["has_answer"] for r in rows), n_all=len(rows),
               recall=recall, misses=misses, final=final,
               latencies=sorted(r["latency"] for r in rows),
               latencies_all=sorted(r["latency_all"] for r in rows))
    out["top_fused"] = {
        a: [r["fused"][0][1] if r["fused"] else 0.0 for r in rows if r["g"]["has_answer"] == a] for a in (True, False)}
    if cached is not None:
        out["top_cosine"] = {a: [r["sig"]["_top_cosine"] for r in rows if r["g"]["has_answer"] == a] for a in (True, False)}
    return out


def _dist(xs) -> str:
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
    return f"n={len(xs)} min {xs[0]:.3f} p25 {q(0.25):.3f} median {q(0.5):.3f} p75 {q(0.75):.3f} max {xs[-1]:.3f}"


def report(r: dict) -> str:
    lines = [f"{r['n']} answerable questions with gold pages ({r['n_answerable']} answerable, {r['n_all']} in all)",
             "", "| method | recall@1 | recall@3 | recall@5 |", "| --- | --- | --- | --- |"]
    for name, rec in r["recall"].items():
        mark = " **(final)**" if name == r["final"] else ""
        lines.append(f"| {name}{mark} | {rec[1]:.3f} | {rec[3]:.3f} | {rec[5]:.3f} |")
    lat, lat_all = r["latencies"], r["latencies_all"]
    ms = lambda xs: f"median {statistics.median(xs) * 1000:.0f} ms, max {xs[-1] * 1000:.0f} ms"
    lines += ["", f"latency per question, final method (analysis + signals + fusion, one document, warm): {ms(lat)}",
              f"latency with every signal (incl. question embedding when measured): {ms(lat_all)}"]
    if "encode_note" in r:
        lines.append(r["encode_note"])
    lines += ["", "top fused score of the final method:",
              f"- answerable: {_dist(r['top_fused'][True])}",
              f"- unanswerable: {_dist(r['top_fused'][False])}"]
    if "top_cosine" in r:
        lines += ["top cosine (question vs best passage):",
                  f"- answerable: {_dist(r['top_cosine'][True])}",
                  f"- unanswerable: {_dist(r['top_cosine'][False])}"]
    lines += ["", "misses at 5 (final method):", *[f"- {m}" for m in r["misses"]]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embeddings", action="store_true", help="include the MiniLM encoder")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    encoder = None
    if args.embeddings:
        from docqa.engine.models.bert import load_minilm

        encoder = load_minilm(max_length=args.max_length)
    text = report(evaluate(encoder, args.cache))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
