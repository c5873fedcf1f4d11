"""Structure of the corpus PDFs as read: words as printed on every PDF, and on the sixteen
10-Ks their Items (against the hand-checked table `tests/data/filing_items.tsv`) and titles.

    .venv/bin/python bench/structure.py [--cache DIR] [--only NAME ...] [--out FILE]

Words: a page "holds a broken word" when a word on it is two words run together (a word no
clean text and no three corpus documents use, found at most twice in its document, that is
two common words joined which that text or the document also writes apart: "millionpeople",
"Resultsof") or when two neighbours are one word split (one is no word on its own, or a lone
small letter, and joined they are a word: "obta in", "s trategy", "ACCOUNTA NTS"). Known
words come from text nobody's PDF reader made (the corpus's HTML, CUAD's own text of three
contracts, the gold files) and from words found in three or more corpus PDFs. The same test reads pypdf's own `extract_text()` (the reference, read
in the same run) and our parser's lines; the share of pages is reported for both, with the
CPU seconds each took. `--cache` keeps both readings per file, keyed by the source of the
parser, so a second run only redoes the counting and the structure.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import pickle
import re
import sys
import time
from collections import Counter
from pathlib import Path

from pypdf import PdfReader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus_split import CORPUS, part  # noqa: E402

from docqa.pipelines.document import assemble  # noqa: E402
from docqa.pipelines.ingest.build import cover_title  # noqa: E402
from docqa.pipelines.ingest.pdf import parse_pdf  # noqa: E402
from docqa.pipelines.ingest.sections import detect_sections  # noqa: E402

ITEMS = ROOT / "tests" / "data" / "filing_items.tsv"
_WORD = re.compile(r"[A-Za-z]+")
_PAIR = re.compile(r"(?<![A-Za-z'’\-])([A-Za-z]+) ([A-Za-z]+)(?![A-Za-z'’\-])")
_SHORT = {"in", "of", "to", "on", "by", "an", "as", "at", "or", "is", "be", "we", "it", "no", "us"}


def parser_hash() -> str:
    """The source of the parser this run imported (another checkout's, under PYTHONPATH, to
    measure an earlier commit)."""
    from docqa.pipelines import document
    from docqa.pipelines.ingest import pdf

    h = hashlib.sha256()
    for module in (pdf, document):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:12]


def read(path: Path, cache: Path | None) -> dict:
    """pypdf's lines and ours for one PDF, with the CPU seconds of each."""
    pkl = cache / f"{path.stem}-{parser_hash()}.pkl" if cache else None
    if pkl and pkl.exists():
        return pickle.loads(pkl.read_bytes())
    t = time.process_time()
    reader = PdfReader(path)
    if reader.is_encrypted:
        reader.decrypt("")
    ref = [[ln for ln in p.extract_text().splitlines() if ln.strip()] for p in reader.pages]
    t_ref = time.process_time() - t
    t = time.process_time()
    raw, meta = parse_pdf(path)
    t_ours = time.process_time() - t
    out = {"ref": ref, "raw": raw, "meta": meta, "t_ref": t_ref, "t_ours": t_ours}
    if pkl:
        pkl.write_bytes(pickle.dumps(out))
    return out


def clean_words() -> tuple[Counter, set]:
    """The words of text no PDF reader made, and the pairs of words it writes apart."""
    texts = [html.unescape(re.sub(r"<[^>]+>", " ", f.read_text(encoding="utf-8", errors="ignore")))
             for f in (CORPUS / "html").glob("*.html")]
    texts += [f.read_text(encoding="utf-8", errors="ignore")
              for f in [*(CORPUS / "qa").glob("*.cuad.txt"), *(CORPUS / "qa").glob("*.jsonl")]]
    words = Counter(w.lower() for t in texts for w in _WORD.findall(t))
    return words, word_pairs(texts)


def broken_words(lines: list[str], known: set[str], common: set[str], in_doc: Counter, apart: set) -> list[str]:
    """The joined and split words of one page (see the module docstring); `apart` holds the
    word pairs written apart somewhere (so "baseline" and "throughout" are no joins)."""
    found = []
    for line in lines:
        line = line.replace("\xa0", " ")
        for tok in _WORD.findall(line):
            w = tok.lower()
            if len(w) < 5 or w in known or in_doc[w] > 2 or re.search(r"[a-z][A-Z]", tok):
                continue
            for k in range(2, len(w) - 1):
                a, b = w[:k], w[k:]
                if a in common and b in common and (a, b) in apart and all(len(x) > 2 or x in _SHORT for x in (a, b)):
                    found.append(tok)
                    break
        for m in _PAIR.finditer(line):
            a, b = m.group(1), m.group(2)
            # a lone capital is an initial or an abbreviation's ("Mark S.", "S. de C.V.")
            fragment = lambda x: x.lower() not in known or (len(x) == 1 and x in "bcdefghjklmnopqrstuvwxyz")  # noqa: E731
            if len(a + b) >= 4 and (a + b).lower() in known and (fragment(a) or fragment(b)):
                found.append(m.group(0))
    return found


_APART = re.compile(r"(?<![\w'’\-])[A-Za-z]+(?![\w'’\-])")  # a word between spaces ("non-disclosure" is none)


def word_pairs(lines) -> set:
    pairs = set()
    for line in lines:
        words = [w.lower() for w in _APART.findall(line)]
        pairs.update(zip(words, words[1:]))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--only", nargs="*", help="file names (stems) to read")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--before", type=Path, help="a --cache folder written by an earlier commit's parser "
                    "(run with its checkout on PYTHONPATH): its readings become the 'before' column")
    args = ap.parse_args()
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    paths = sorted((CORPUS / "pdf").glob("*.pdf")) + sorted((CORPUS / "zh").glob("*.pdf"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    docs = {}
    for p in paths:
        docs[p.name] = read(p, args.cache)
        print(f"read {p.name}: pypdf {docs[p.name]['t_ref']:.1f} s, ours {docs[p.name]['t_ours']:.1f} s",
              file=sys.stderr, flush=True)

    clean, apart = clean_words()
    doc_freq: Counter = Counter()
    for d in docs.values():
        doc_freq.update({w.lower() for page in d["ref"] for ln in page for w in _WORD.findall(ln)})
    known = set(clean) | {w for w, n in doc_freq.items() if n >= 3}
    common = {w for w, n in clean.items() if n >= 20} | {w for w, n in doc_freq.items() if n >= 5}

    before = {}
    for name in docs:
        old = sorted(args.before.glob(f"{Path(name).stem}-*.pkl"), key=lambda f: f.stat().st_mtime) if args.before else []
        if old:
            before[name] = pickle.loads(old[-1].read_bytes())
    out = ["| document | part | pages | pages with broken words: pypdf | before | after | CPU s: pypdf | before | after |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    totals = Counter()
    examples = []
    for name, d in docs.items():
        b = before.get(name)
        readings = [("ref", d["ref"]), ("after", [[ln.text for ln in p.lines] for p in d["raw"]])]
        if b:
            readings.append(("before", [[ln.text for ln in p.lines] for p in b["raw"]]))
        counts = {}
        for key, pages in readings:
            in_doc = Counter(w.lower() for page in pages for ln in page for w in _WORD.findall(ln))
            pairs = apart | word_pairs(ln for page in pages for ln in page)
            hits = [broken_words(page, known, common, in_doc, pairs) for page in pages]
            counts[key] = sum(1 for h in hits if h)
            if key == "after":
                examples += [(name, n + 1, h[:3]) for n, h in enumerate(hits) if h][:3]
        n = len(d["ref"])
        try:
            which = part(name)
        except ValueError:
            which = "-"
        share = lambda k: f"{counts[k]} ({counts[k] / n:.0%})" if k in counts else "-"  # noqa: E731
        totals.update(pages=n, ref=counts["ref"], after=counts["after"], t_ref=d["t_ref"], t_after=d["t_ours"])
        if b:
            totals.update(b_pages=n, b_ref=counts["ref"], b_before=counts["before"], b_after=counts["after"],
                          b_t_ref=d["t_ref"], b_t_ref_then=b["t_ref"], b_t_before=b["t_ours"], b_t_after=d["t_ours"])
        out.append(f"| {name[:48]} | {which} | {n} | {share('ref')} | {share('before')} | {share('after')} "
                   f"| {d['t_ref']:.1f} | {b['t_ours'] if b else float('nan'):.1f} | {d['t_ours']:.1f} |")
    t = totals
    out.append(f"| all | | {t['pages']} | {t['ref']} ({t['ref'] / t['pages']:.1%}) | - | {t['after']} ({t['after'] / t['pages']:.1%}) "
               f"| {t['t_ref']:.0f} | - | {t['t_after']:.0f} |")
    if t["b_pages"]:
        out.append(f"| those with a before | | {t['b_pages']} | {t['b_ref']} ({t['b_ref'] / t['b_pages']:.1%}) "
                   f"| {t['b_before']} ({t['b_before'] / t['b_pages']:.1%}) | {t['b_after']} ({t['b_after'] / t['b_pages']:.1%}) "
                   f"| {t['b_t_ref']:.0f} | {t['b_t_before']:.0f} ({t['b_t_before'] / t['b_t_ref_then']:.2f}× its run's pypdf) "
                   f"| {t['b_t_after']:.0f} ({t['b_t_after'] / t['b_t_ref']:.2f}× pypdf) |")
    out += ["", "Pages still flagged (first three per document):", ""]
    out += [f"- {name} p.{n}: {', '.join(h)}" for name, n, h in examples]

    expected = load_items()
    out += ["", "| filing | part | Items right (page) | wrong or missing | titles of 1, 1A, 7, 7A, 8 | title |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, d in docs.items():
        if not name.startswith("filing_"):
            continue
        doc = assemble(d["raw"], doc_id="t", content_sha256="t", path=name, type="pdf", metadata=d["meta"])
        doc.sections = detect_sections(doc)
        got = {s.number: s for s in doc.sections if s.number and s.number.startswith("Item ")}
        want = expected.get(name.removeprefix("filing_").removesuffix("_10K.pdf"), {})
        right = [k for k, v in want.items() if k in got and got[k].span.page == v]
        wrong = [f"{k}: {got[k].span.page if k in got else '-'} (want {v})" for k, v in want.items() if k not in right]
        wrong += [f"{k}: {s.span.page} (none)" for k, s in got.items() if k not in want]
        titled = [k for k in ("Item 1", "Item 1A", "Item 7", "Item 7A", "Item 8") if k in got and got[k].title]
        out.append(f"| {name[7:-8]} | {part(name)} | {len(right)}/{len(want)} | {'; '.join(wrong) or '-'} "
                   f"| {len(titled)}/{sum(1 for k in ('Item 1', 'Item 1A', 'Item 7', 'Item 7A', 'Item 8') if k in want)} "
                   f"| {cover_title(doc)} |")
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


def load_items() -> dict[str, dict[str, int]]:
    """The hand-checked table: filing, Item, page where its heading opens the body."""
    table: dict[str, dict[str, int]] = {}
    for line in ITEMS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#") and not line.startswith("filing\t"):
            filing, item, page = line.split("\t")[:3]
            table.setdefault(filing, {})[item] = int(page)
    return table


if __name__ == "__main__":
    main()
