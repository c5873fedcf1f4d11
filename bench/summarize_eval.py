"""`docqa summarize` on the corpus: CUAD coverage against a plain baseline, faithfulness,
clustering methods against the CUAD clause categories, and multi-document summaries.

    .venv/bin/python bench/summarize_eval.py --db /tmp/summarize_eval.db --out bench/results/summarize.md

What it measures, all in one run:
- coverage: for each corpus contract, the share of its answerable CUAD clause categories
  (those with a gold page) whose gold page is among the pages the summary cites
  (`--length detailed`), for the summarizer and for the baseline (the first sentence of
  each section, cited); with the number of sentences and of distinct pages each cites,
  since citing every page would cover everything;
- faithfulness: every shown citation re-checked against the page's lines as `docqa show
  --page` prints them (the quote, normalised, within the cited lines); sentences dropped for
  want of a verified citation and statements whose quote did not verify, counted;
- clustering: the CUAD gold spans of each contract (and of the three together) clustered
  by the three methods of `pipelines.answer.summarize.cluster` into as many groups as there are
  categories, scored against the categories (adjusted Rand index, normalised mutual info);
- multi-document summaries: the three contracts (per-party obligations, key terms,
  cross-document conflicts), RFC 9110 + RFC 9112 (element-id citations), and the corpus
  paper with its [PAPER:] header.

`--model` runs the map step with the default engine instead of `--evidence-only`; on a
2-core CPU that is seconds to minutes per segment, as loaded.

`--statements` checks the summaries of the fifteen corpus contracts (issue 28), reported per part
of `bench/corpus_split.py`: statements whole (ending where their sentence ends, not at a line
end), none shown twice, and the key clauses (parties, term, termination, governing law, payment,
liability) cited on their CUAD gold pages wherever the gold has the clause; `--only NAME` keeps
the contracts whose file name holds NAME (for a model run on a few):

    .venv/bin/python bench/summarize_eval.py --statements --out /tmp/statements.md
    .venv/bin/python bench/summarize_eval.py --statements --model --only LIMEENERGY --only Quaker

`--speed` times the command itself on a ~100-page contract: the 107-page ArrayBioPharma
agreement is ingested into a fresh store and `docqa summarize DOC --length detailed --json`
runs in a child process; it prints one JSON object (wall time, segments/s, the summary's
counts). `--model DIR|GGUF` and `--device` pass through to the command, so the same
invocation measures the default model on a CPU and an 8B checkpoint on a GPU:

    .venv/bin/python bench/summarize_eval.py --speed                                     # default model, CPU
    .venv/bin/python bench/summarize_eval.py --speed --model /path/to/8b --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = (ROOT / ".." / "shared" / "corpus").resolve()
CONTRACTS = [
    "pdf/contract_ArrayBioPharma_Ono_License_Development_Commercialization_Agreement.pdf",
    "pdf/contract_GooseheadInsurance_Franchise_Agreement.pdf",
    "pdf/contract_IBM_MSL_Outsourcing_Agreement.pdf",
]
PAPER = "pdf/paper_arXiv_2307.03172_Lost_in_the_Middle.pdf"
RFCS = ["html/rfc9110_HTTP_Semantics.html", "html/rfc9112_HTTP_1.1.html"]


def ingest(store, rel: str) -> str:
    from docqa.app.ingest import ingest_path

    return ingest_path(store, CORPUS / rel, max_bytes=200_000_000)["doc_id"]


def gold_pages() -> dict[str, dict[str, set[int]]]:
    """doc file -> category -> gold pages, for answerable categories with a gold page."""
    out: dict[str, dict[str, set[int]]] = defaultdict(dict)
    for line in (CORPUS / "qa/cuad_gold_subset_3contracts.jsonl").read_text().splitlines():
        q = json.loads(line)
        if not q["has_answer"]:
            continue
        pages = {p for s in q["gold_spans"] for p in (s["pdf_pages_1based"] or [])}
        if pages:
            out[q["doc_file"]][q["category"]] = pages
    return out


def gold_spans() -> dict[str, list[tuple[str, str]]]:
    """doc file -> (category, span text) for spans of at least 25 characters."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for line in (CORPUS / "qa/cuad_gold_subset_3contracts.jsonl").read_text().splitlines():
        q = json.loads(line)
        for s in q["gold_spans"] if q["has_answer"] else []:
            if len(s["text"]) >= 25:
                out[q["doc_file"]].append((q["category"], s["text"]))
    return out


def recheck(store, c) -> bool:
    """The citation against `show --page`'s lines: its quote within the cited lines."""
    from docqa.pipelines.textnorm import normalize

    if c.span.page is not None:
        page = c.span.page
    else:
        row = store.db.execute("SELECT n FROM pages WHERE doc_id = ? AND label = ?", [c.doc_id, c.span.element_id]).fetchone()
        if row is None:
            return False
        page = row[0]
    _, p = store.get_page(c.doc_id, page)
    text = "\n".join(ln.text for ln in p.lines[c.span.line_start - 1 : c.span.line_end])
    return bool(c.quote.strip()) and normalize(c.quote) in normalize(text)


def chance(cats: dict[str, set[int]], n_pages: int, cited: int) -> float:
    """Categories a set of `cited` pages drawn at random would cover, on average."""
    return sum(1 - math.comb(n_pages - len(g), cited) / math.comb(n_pages, cited) for g in cats.values())


def coverage(cats: dict[str, set[int]], cites) -> tuple[int, list[str]]:
    pages = {c.span.page for c in cites}
    hit = [k for k, gp in cats.items() if gp & pages]
    return len(hit), sorted(set(cats) - set(hit))


def ari(labels_true: list, labels_pred: list) -> float:
    n = len(labels_true)
    pairs = Counter(zip(labels_true, labels_pred))
    a, b = Counter(labels_true), Counter(labels_pred)
    comb = lambda x: x * (x - 1) / 2  # noqa: E731
    index = sum(comb(v) for v in pairs.values())
    sa, sb = sum(comb(v) for v in a.values()), sum(comb(v) for v in b.values())
    expected = sa * sb / comb(n) if n > 1 else 0.0
    top = (sa + sb) / 2
    return (index - expected) / (top - expected) if top != expected else 0.0


def nmi(labels_true: list, labels_pred: list) -> float:
    n = len(labels_true)
    pairs = Counter(zip(labels_true, labels_pred))
    a, b = Counter(labels_true), Counter(labels_pred)
    mi = sum(v / n * math.log(n * v / (a[i] * b[j])) for (i, j), v in pairs.items())
    h = lambda c: -sum(v / n * math.log(v / n) for v in c.values())  # noqa: E731
    denom = (h(a) + h(b)) / 2
    return mi / denom if denom else 1.0


def cluster_eval(docs: dict, items: list[tuple[str, str, str]], embed) -> dict[str, tuple[float, float, int]]:
    """items: (doc_id, category, span text) -> {method: (ARI, NMI, n)}."""
    from docqa.pipelines.answer.citations import find_in_document, relocate
    from docqa.pipelines.answer.summarize import Statement, cluster

    stmts, cats = [], []
    for doc_id, cat, text in items:
        doc = docs[doc_id]
        hit = find_in_document(doc, text)
        if hit is None:
            continue
        c = relocate(doc, hit, quote=text)
        stmts.append(Statement(doc_id=doc_id, segment=0, text=" ".join(text.split()), citations=[c]))
        cats.append(cat)
    k = len(set(cats))
    out = {}
    for method in ("embedding", "section", "embedding+section"):
        groups = cluster(stmts, docs, method=method, embed=embed, max_clusters=k, threshold=float("inf"))
        pred = [0] * len(stmts)
        for g, members in enumerate(groups):
            for i in members:
                pred[i] = g
        out[method] = (ari(cats, pred), nmi(cats, pred), len(stmts))
    return out


def excerpt(summary, kinds: tuple[str, ...], per_block: int, width: int = 220, max_blocks: int = 99) -> list[str]:
    multi = len(summary.doc_ids) > 1
    out = []
    shown = [b for b in summary.blocks if b.kind in kinds]
    for b in shown[:max_blocks]:
        out.append(f"**{b.title}**" if b.kind != "paper" else f"**{b.title}**")
        for s in b.sentences[:per_block]:
            text = s.text if len(s.text) <= width else s.text[: width - 1] + "…"
            out.append(f"- {text} " + " ".join(f"`{c.label(with_doc=multi)}`" for c in s.citations))
        if len(b.sentences) > per_block:
            out.append(f"- … {len(b.sentences) - per_block} more")
        out.append("")
    if len(shown) > max_blocks:
        out += [f"… {len(shown) - max_blocks} more blocks", ""]
    return out


DEFAULT = "default"  # `--model` without a value: the default engine
SPEED_DOC = CORPUS / CONTRACTS[0]  # 107 pages, 36 segments of 2,048 tokens
CLI = "import sys; from docqa.app.cli import main; sys.argv[0] = 'docqa'; main()"


def speed(db: str | None, model: str | None, device: str | None, length: str, doc: Path = SPEED_DOC) -> dict:
    """`docqa summarize` on the 107-page contract (or `doc`), timed from outside the command."""
    from docqa.app.store import Store

    db = db or str(Path(tempfile.mkdtemp(prefix="summarize_speed_")) / "speed.db")
    with Store(db) as store:
        doc_id = ingest(store, doc)
        pages, segments = (store.db.execute(q, [doc_id]).fetchone()[0] for q in (
            "SELECT count(*) FROM pages WHERE doc_id = ?", "SELECT count(*) FROM segments WHERE doc_id = ?"))
    argv = ["summarize", doc_id, "--length", length, "--json", "--db", db]
    argv += ["--model", model] if model else []
    argv += ["--device", device] if device else []
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", CLI, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"docqa summarize failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    v = json.loads(proc.stdout)
    st = v["stats"]
    return {"command": "docqa " + " ".join(argv), "document": Path(doc).name, "pages": pages,
            "segments": segments, "model": v["model"], "device": device or os.environ.get("DOCQA_DEVICE") or "auto",
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "segments_per_s_wall": round(segments / wall, 4),
            "load_s": round(st.get("load_s", 0.0), 1), "map_s": round(st["map_s"], 1), "segments_per_s_map": round(st["segments_per_s"], 4),
            "cluster_s": round(st["cluster_s"], 1), "summarise_s": round(st["summarise_s"], 1),
            "resumed_segments": int(st["resumed_segments"]), "clusters": int(st["clusters"]),
            "sentences": sum(len(b["sentences"]) for b in v["blocks"]),
            "citations": sum(len(s["citations"]) for b in v["blocks"] for s in b["sentences"]),
            "dropped_sentences": v["dropped_sentences"], "rejected_statements": v["rejected_statements"],
            "cpu_count": os.cpu_count(), "loadavg_before": None}


# A statement is whole when it ends where a sentence or a clause ends (U+037E: the semicolon
# of EDGAR filings), not at a line end.
WHOLE_END = re.compile(r"[.;\u037e:!?)\"”’]$")
# The key clauses against the CUAD categories that name the same clause.
GOLD_OF = {"Parties": ("Parties",), "Term": ("Expiration Date", "Renewal Term"),
           "Termination": ("Termination For Convenience",), "Governing law": ("Governing Law",),
           "Payment": ("Revenue/Profit Sharing", "Minimum Commitment"),
           "Liability": ("Cap On Liability", "Uncapped Liability")}


def statements(args, model: str | None) -> list[str]:
    """The `--statements` report: per contract and per part, whole statements, statements
    shown twice, and the key clauses on their CUAD gold pages."""
    sys.path.insert(0, str(ROOT / "bench"))
    from corpus_split import cuad_questions, part

    from docqa.app.store import Store
    from docqa.app.summarize import SummarizeSettings, summarize

    gold: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for q in cuad_questions():
        if q["has_answer"]:
            gold[Path(q["doc_file"]).name][q["category"]] |= {p for g in q["gold_spans"] for p in (g["pdf_pages_1based"] or [])}
    names = sorted(n for n in gold if not args.only or any(o in n for o in args.only))
    settings = SummarizeSettings(model=model, device=args.device, length=args.length, evidence_only=not args.model)
    store = Store(args.db)
    rows, per_part = [], defaultdict(Counter)
    for name in names:
        doc_id = ingest(store, f"pdf/{name}")
        run, summ = summarize(store, [doc_id], settings,
                              on_progress=lambda d, t, w: print(f"\r{name[9:40]} {d}/{t}", end="", file=sys.stderr))
        print(file=sys.stderr)
        stated = [x for b in summ.blocks if b.kind not in ("outline", "conflicts") for x in b.sentences]
        whole = sum(bool(WHOLE_END.search(x.text)) for x in stated)
        pages2 = sum(len({c.span.page for c in x.citations}) > 1 for x in stated)
        seen, twice = [], 0
        for x in stated:
            spans = [(c.span.char_start, c.span.char_end) for c in x.citations if c.span.char_start is not None]
            twice += any(a < d and c < b for a, b in spans for c, d in seen)
            seen += spans
        pages = {c.span.page for x in stated for c in x.citations}
        clauses = {x.text.split(": ", 1)[0] for b in summ.blocks if b.kind == "clauses" for x in b.sentences}
        cells = []
        c = per_part[part(name)]
        c.update(docs=1, stated=len(stated), whole=whole, twice=twice, pages2=pages2, sentences=len(summ.sentences()))
        for clause, cats in GOLD_OF.items():
            gp = set().union(*(gold[name].get(k, set()) for k in cats))
            c[f"{clause} shown"] += clause in clauses
            if gp:
                hit = bool(gp & pages)
                c.update({f"{clause} gold": 1, f"{clause} hit": hit})
                cells.append("✓" if hit else "✗")
            else:
                cells.append("—")
        rows.append(f"| {name[9:45]} | {part(name)} | {len(stated)} | {whole} | {twice} | {pages2} | " + " | ".join(cells) + " |")
    mode = f"the model ({run.model})" if args.model and names else "--evidence-only"
    lines = ["## Statements: whole, once, and the key clauses (issue 28)", "",
             f"Map step: {mode}; length {args.length}. Run {time.strftime('%Y-%m-%d %H:%M')}. "
             "Statements: every summary sentence but the outline's headings and the conflicts. Whole: it ends "
             "where a sentence or clause ends. Twice: a statement whose citation shares characters with an "
             "earlier one. Key clauses: ✓ the summary cites a CUAD gold page of the clause (Parties; Expiration "
             "Date or Renewal Term; Termination For Convenience; Governing Law; Revenue/Profit Sharing or Minimum "
             "Commitment; Cap On Liability or Uncapped Liability), ✗ it does not, — no gold for it.", "",
             "| contract | part | statements | whole | twice | over a page break | " + " | ".join(GOLD_OF) + " |",
             "|---|---|---:|---:|---:|---:|" + ":-:|" * len(GOLD_OF)] + rows + [""]
    lines += ["| part | contracts | statements | whole | twice | " + " | ".join(f"{k}: gold hit / shown" for k in GOLD_OF)
              + " | all clauses with gold |", "|---|---:|---:|---:|---:|" + "---:|" * (len(GOLD_OF) + 1)]
    for p, c in sorted(per_part.items(), reverse=True):
        hit = sum(c[f"{k} hit"] for k in GOLD_OF)
        n = sum(c[f"{k} gold"] for k in GOLD_OF)
        lines.append(f"| {p} | {c['docs']} | {c['stated']} | {c['whole']} ({c['whole'] / max(1, c['stated']):.1%}) | "
                     f"{c['twice']} | " + " | ".join(f"{c[f'{k} hit']}/{c[f'{k} gold']} / {c[f'{k} shown']}"
                                                    for k in GOLD_OF) + f" | **{hit}/{n}** |")
    return lines + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="/tmp/summarize_eval.db")
    ap.add_argument("--out", default=None, help="write the Markdown report here")
    ap.add_argument("--model", nargs="?", const=DEFAULT, default=None, metavar="DIR|GGUF",
                    help="map with a model instead of --evidence-only: the default engine, or the checkpoint given")
    ap.add_argument("--length", default="detailed")
    ap.add_argument("--speed", action="store_true", help="time `docqa summarize` on the 107-page contract; print JSON")
    ap.add_argument("--device", default=None, help="the model's device (cpu, cuda, ...) [default: auto]")
    ap.add_argument("--speed-doc", type=Path, default=None,
                    help="with --speed: the contract's PDF, where the corpus is not beside the checkout (a GPU machine)")
    ap.add_argument("--coverage-only", action="store_true",
                    help="only the CUAD coverage and faithfulness (the report is rewritten after each contract)")
    ap.add_argument("--statements", action="store_true",
                    help="whole statements, none twice, key clauses on gold pages: the fifteen corpus contracts")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="with --statements: only the contracts whose file name holds NAME (repeatable)")
    args = ap.parse_args()
    if not CORPUS.exists() and not (args.speed and args.speed_doc):
        print(f"the corpus is not at {CORPUS}", file=sys.stderr)
        return 2
    if args.speed:
        load = os.getloadavg()
        model = None if args.model in (None, DEFAULT) else args.model
        result = speed(args.db if args.db != ap.get_default("db") else None, model, args.device, args.length,
                       args.speed_doc or SPEED_DOC)
        result["loadavg_before"] = [round(x, 2) for x in load]
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(result, indent=2))
        return 0
    from docqa.app.service import Library
    from docqa.app.store import Store
    from docqa.app.summarize import SummarizeSettings, minilm_embed, summarize
    from docqa.pipelines.answer.summarize import first_sentences

    cmd = "    .venv/bin/python bench/summarize_eval.py " + " ".join(sys.argv[1:])
    if args.statements:
        t0 = time.perf_counter()
        model = None if args.model in (None, DEFAULT) else args.model
        return finish([cmd, ""] + statements(args, model), t0, args.out)
    store = Store(args.db)
    t0 = time.perf_counter()
    ids = {rel: ingest(store, rel) for rel in CONTRACTS + ([] if args.coverage_only else [PAPER] + RFCS)}
    docs, _ = Library(store).load(list(ids.values()))
    model = None if args.model in (None, DEFAULT) else args.model
    settings = SummarizeSettings(model=model, device=args.device, length=args.length, evidence_only=not args.model)
    mode = "default engine (quote-constrained map)" if args.model else "--evidence-only (rule-ranked map, no model)"
    lines = ["# `docqa summarize` — coverage, faithfulness, clustering, multi-document summaries", "", cmd, "",
             f"Map step: {mode}; length {args.length}. Run {time.strftime('%Y-%m-%d %H:%M')}.", ""]

    # -- coverage and faithfulness per contract ---------------------------------------------
    gold = gold_pages()
    lines += ["## CUAD coverage per contract (same run)", "",
              "| contract | pages | answerable categories with a gold page | summary: covered | sentences | "
              "distinct pages cited | chance at those pages | baseline: covered | sentences | distinct pages cited | "
              "chance at those pages | summary s | segments (stored before) | segments/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    shown = rechecked = dropped = rejected = 0
    base_shown = base_ok = 0
    misses = {}
    tot = Counter()
    for rel in CONTRACTS:
        did = ids[rel]
        run, summ = summarize(store, [did], settings, on_progress=lambda d, t, w: print(f"\r{rel[4:30]} {d}/{t}", end="", file=sys.stderr))
        print(file=sys.stderr)
        base = first_sentences(docs[did])
        cats = gold[rel]
        cov, miss = coverage(cats, summ.citations())
        bcov, _ = coverage(cats, base.citations())
        misses[rel] = miss
        cites = summ.citations()
        shown += len(cites)
        rechecked += sum(recheck(store, c) for c in cites)
        base_shown += len(base.citations())
        base_ok += sum(recheck(store, c) for c in base.citations())
        dropped += summ.dropped
        rejected += summ.rejected
        st = summ.stats
        tot.update(cats=len(cats), cov=cov, bcov=bcov)
        n_pages = len(docs[did].pages)
        sp, bp = len({c.span.page for c in cites}), len({c.span.page for c in base.citations()})
        tot.update(chance=chance(cats, n_pages, sp), bchance=chance(cats, n_pages, bp))
        lines.append(f"| {Path(rel).stem[9:40]} | {n_pages} | {len(cats)} | {cov} ({cov / len(cats):.0%}) | "
                     f"{len(summ.sentences())} | {sp} | {chance(cats, n_pages, sp):.1f} | {bcov} ({bcov / len(cats):.0%}) | "
                     f"{len(base.sentences())} | {bp} | {chance(cats, n_pages, bp):.1f} | {st['total_s']:.1f} | "
                     f"{int(st['segments'])} ({int(st['resumed_segments'])}) | {st['segments_per_s']:.3f} |")
        if args.out and args.coverage_only:  # a long model run leaves its figures as it goes
            Path(args.out).write_text("\n".join(lines) + "\n")
    lines.append(f"| **all three** | | {tot['cats']} | {tot['cov']} ({tot['cov'] / tot['cats']:.0%}) | | | {tot['chance']:.1f} | "
                 f"{tot['bcov']} ({tot['bcov'] / tot['cats']:.0%}) | | | {tot['bchance']:.1f} | | | |")
    lines += ["", "Categories the summary missed: " + "; ".join(f"{Path(r).stem[9:25]}: {', '.join(m) or '—'}"
                                                           for r, m in misses.items()), "",
              "## Faithfulness", "",
              f"- summary citations shown: {shown}; re-verified against `show --page` lines: {rechecked} "
              f"({rechecked / max(shown, 1):.1%})",
              f"- baseline citations: {base_shown}; re-verified: {base_ok}",
              f"- sentences dropped for want of a verified citation: {dropped}; statements whose quote did "
              f"not verify in the map step: {rejected}", ""]

    if args.coverage_only:
        return finish(lines, t0, args.out)

    # -- clustering ------------------------------------------------------------------------
    embed = minilm_embed()
    spans = gold_spans()
    lines += ["## Clustering: methods against the CUAD clause categories", "",
              "Gold spans (≥ 25 characters) located in each contract, clustered into as many groups as it has "
              "categories; adjusted Rand index and normalised mutual information against the categories "
              "(1 = the categories exactly, 0 = chance).", "",
              "| spans of | n | embedding ARI / NMI | section ARI / NMI | embedding+section ARI / NMI |",
              "|---|---|---|---|---|"]
    pooled = []
    for rel in CONTRACTS:
        items = [(ids[rel], cat, text) for cat, text in spans[rel]]
        pooled += items
        r = cluster_eval(docs, items, embed)
        lines.append(f"| {Path(rel).stem[9:40]} | {r['section'][2]} | " + " | ".join(
            f"{r[m][0]:.3f} / {r[m][1]:.3f}" for m in ("embedding", "section", "embedding+section")) + " |")
    r = cluster_eval(docs, pooled, embed)
    lines.append(f"| three contracts together | {r['section'][2]} | " + " | ".join(
        f"{r[m][0]:.3f} / {r[m][1]:.3f}" for m in ("embedding", "section", "embedding+section")) + " |")
    lines.append("")

    # -- multi-document summaries ------------------------------------------------------------
    multi_settings = SummarizeSettings(model=model, device=args.device, length="standard", evidence_only=not args.model)
    run, summ = summarize(store, [ids[r] for r in CONTRACTS], multi_settings)
    ok = sum(recheck(store, c) for c in summ.citations())
    lines += ["## Three contracts together (standard)", "",
              f"Run `{run.id}`: {len(summ.sentences())} sentences, {len(summ.citations())} citations, {ok} re-verified; "
              f"dropped {summ.dropped}; {int(summ.stats['clusters'])} topics; {summ.stats['total_s']:.1f} s "
              f"({int(summ.stats['resumed_segments'])} of {int(summ.stats['segments'])} segments stored before).", ""]
    lines += excerpt(summ, ("obligations", "terms"), 3)
    lines += excerpt(summ, ("conflicts",), 40)
    lines += excerpt(summ, ("topic",), 2, max_blocks=8)
    run, summ = summarize(store, [ids[r] for r in RFCS], multi_settings)
    ok = sum(recheck(store, c) for c in summ.citations())
    lines += ["## RFC 9110 + RFC 9112 (standard)", "",
              f"Run `{run.id}`: {len(summ.sentences())} sentences, {len(summ.citations())} citations (element ids), "
              f"{ok} re-verified; dropped {summ.dropped}; {int(summ.stats['clusters'])} topics; "
              f"{summ.stats['total_s']:.1f} s.", ""]
    lines += excerpt(summ, ("topic",), 2, max_blocks=10)
    lines += excerpt(summ, ("conflicts",), 10)
    run, summ = summarize(store, [ids[PAPER]], multi_settings)
    ok = sum(recheck(store, c) for c in summ.citations())
    lines += ["## The corpus paper (standard)", "",
              f"Run `{run.id}`: {len(summ.sentences())} sentences, {len(summ.citations())} citations, {ok} re-verified; "
              f"dropped {summ.dropped}; {summ.stats['total_s']:.1f} s.", ""]
    lines += excerpt(summ, ("paper", "conclusions"), 5)
    lines += excerpt(summ, ("outline",), 20)
    lines += excerpt(summ, ("topic",), 2, max_blocks=6)
    return finish(lines, t0, args.out)


def finish(lines: list[str], t0: float, out: str | None) -> int:
    lines.append(f"Total wall time of this evaluation: {time.perf_counter() - t0:.0f} s; load average at the end "
                 f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs.")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
