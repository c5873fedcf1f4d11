"""Citation-backed reports of a run or a review job: Markdown, self-contained HTML, JSON.

`build_report()` reads what is stored (runs, citations, the job's checklist) into one
plain structure; each format renders that structure and nothing else, so the three always
agree. Links point at the source: `file:///…/contract.pdf#page=12` for PDFs (what browsers'
PDF viewers open at the page), `file:///…/rfc9110.html#<element id>` for HTML. Document
text is data: the HTML template escapes everything (jinja2 autoescape) and its
Content-Security-Policy forbids scripts and any external load; Markdown escapes `<`, `>`
and `&` so a renderer cannot turn a quote into markup.

Reports are for handing on: a summary table of the items first, then per item its answer and
its best citation (with the quote), and the rest of the evidence after it — one line each in
Markdown, collapsed in HTML. JSON keeps every citation in full.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import jinja2

from ..pipelines.answer.citations import Citation
from ..pipelines.ingest.html import link_target
from .errors import DocqaError
from .jobs import JobError, get_job, job_runs
from .runs import Run, RunNotFound, get_run, model_label
from .store import Store

Format = Literal["md", "html", "json"]
FORMATS = ("md", "html", "json")


@dataclass
class CitationView:
    doc_id: str
    label: str  # "p. 12, lines 30-34" / "§ rfc.section.15.5.5, line 3"
    marker: str  # "[PAGE:12, LINE:30-34]", as answers write it
    href: str | None
    quote: str
    verified: bool
    page: int | None
    section_id: str | None
    line_start: int
    line_end: int
    supports: bool | None = None  # the quote answers the question (None: not judged)


@dataclass
class Row:
    item_id: str | None
    question: str
    type: str | None
    kind: str
    status: str
    answer: str | None
    run_id: str | None
    model: str | None
    citations: list[CitationView] = field(default_factory=list)
    evidence: list[CitationView] = field(default_factory=list)
    draft: str | None = None  # a withheld answer: what the model wrote, none of its citations supporting it
    draft_citations: list[CitationView] = field(default_factory=list)

    def best(self) -> CitationView | None:
        """The one citation shown with the answer: a supporting one, else the answer's first,
        else (no answer) the top evidence."""
        return next((c for c in self.citations if c.supports), None) or next(iter(self.citations + self.evidence), None)

    def rest(self) -> list[CitationView]:
        """Every other citation and passage of evidence, in order, each place once."""
        best, seen, out = self.best(), set(), []
        for c in self.citations + self.evidence:
            key = (c.doc_id, c.page, c.section_id, c.line_start, c.line_end)
            if c is not best and key not in seen and (best is None or key != (best.doc_id, best.page, best.section_id,
                                                                           best.line_start, best.line_end)):
                seen.add(key)
                out.append(c)
        return out


@dataclass
class DocReport:
    doc_id: str
    path: str
    title: str | None
    rows: list[Row]
    removed: bool = False  # removed from the database since (`docqa rm`); its path and title are gone

    @property
    def name(self) -> str:
        return f"{self.doc_id} (removed)" if self.removed else self.title or Path(self.path).name


@dataclass
class Report:
    kind: Literal["job", "run"]
    id: str
    title: str
    checklist: str | None
    settings: dict
    created_at: str
    documents: list[DocReport]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.documents:
            for r in d.rows:
                out[r.status] = out.get(r.status, 0) + 1
        return dict(sorted(out.items()))


def source_href(path: str, doc_type: str, c: Citation) -> str | None:
    """Where a citation opens in the source file (None when the file is gone)."""
    p = Path(path)
    if not p.is_absolute():
        return None
    uri = p.as_uri()
    if c.span.element_id:
        return f"{uri}#{link_target(c.span.element_id)}"
    if doc_type == "pdf" and c.span.page:
        return f"{uri}#page={c.span.page}"
    return uri


def _view(store: Store, c: Citation, doc_cache: dict) -> CitationView:
    if c.doc_id not in doc_cache:
        row = store.db.execute("SELECT path, type FROM documents WHERE doc_id = ?", [c.doc_id]).fetchone()
        doc_cache[c.doc_id] = row or ("", "")
    path, doc_type = doc_cache[c.doc_id]
    lines = f"line {c.span.line_start}" if c.span.line_start == c.span.line_end else f"lines {c.span.line_start}-{c.span.line_end}"
    label = f"§ {c.span.element_id}, {lines}" if c.span.element_id else f"p. {c.span.page}, {lines}"
    return CitationView(doc_id=c.doc_id, label=label, marker=c.label(),
                        href=source_href(path, doc_type, c) if path else None, quote=c.quote,
                        verified=c.verified, page=c.span.page, section_id=c.span.element_id,
                        line_start=c.span.line_start, line_end=c.span.line_end, supports=c.supports)


def _row(store: Store, run: Run | None, doc_cache: dict, *, item=None) -> Row:
    if run is None:
        return Row(item_id=item.id, question=item.question, type=item.type, kind="review",
                   status="pending", answer=None, run_id=None, model=None)
    shown = [c for c in run.citations if c.verified]  # SPEC §4: unverified never shown as support
    return Row(
        item_id=item.id if item else run.item_id,
        question=item.question if item else run.question,
        type=item.type if item else None,
        kind=run.kind, status=run.status, answer=run.answer, run_id=run.id, model=run.model,
        citations=[_view(store, c, doc_cache) for c in shown],
        evidence=[_view(store, c, doc_cache) for c in run.evidence],
        draft=run.draft,
        draft_citations=[_view(store, c, doc_cache) for c in run.draft_citations if c.verified],
    )


def build_report(store: Store, ref: str) -> Report:
    """The report of job `ref`, else of run `ref` (an id or unique prefix)."""
    doc_cache: dict = {}
    try:
        job = get_job(store, ref)
    except JobError:
        job = None
    if job is not None:
        runs = job_runs(store, job.id)
        docs = []
        for doc_id, path in job.documents:
            rows = [_row(store, runs.get((doc_id, it.id)), doc_cache, item=it) for it in job.checklist.items]
            docs.append(DocReport(doc_id=doc_id, path=path, title=store.info(doc_id).title, rows=rows))
        return Report(kind="job", id=job.id, title=f"Review {job.id}", checklist=job.checklist.name,
                      settings=job.settings, created_at=job.created_at, documents=docs)
    try:
        run = get_run(store, ref)
    except RunNotFound:
        raise DocqaError(f"no job or run named {ref!r} (see `docqa runs` or `docqa browse`)") from None
    docs = []
    for i, doc_id in enumerate(run.doc_ids):
        rows = [_row(store, run, doc_cache)] if i == 0 else []
        if store.has(doc_id):
            info = store.info(doc_id)
            docs.append(DocReport(doc_id=doc_id, path=info.path, title=info.title, rows=rows))
        else:  # a run over several documents outlives one removed since (its citations went with it)
            docs.append(DocReport(doc_id=doc_id, path="", title=None, rows=rows, removed=True))
    return Report(kind="run", id=run.id, title=f"Answer {run.id}", checklist=None,
                  settings=run.settings, created_at=run.created_at, documents=docs)


# -- renderers --------------------------------------------------------------------------


def to_json(report: Report) -> str:
    value = asdict(report) | {"counts": report.counts()}
    return json.dumps(value, ensure_ascii=False, indent=2) + "\n"


# Document text is data in Markdown too: HTML (`<img src=...>`), links and images
# (`[x](url)`, `![x](url)`, `[x]: url`), code spans and emphasis must not render from it.
# Brackets, `!`, backticks, `*`, `_` and backslashes are backslash-escaped (CommonMark), and
# `& < >` become entities, which also stops autolinks `<https://...>`.
_MD_ESCAPES = {ord(c): "\\" + c for c in "\\`*_[]!"} | {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}


def _md_escape(text: str) -> str:
    return text.translate(_MD_ESCAPES)


def _md_quote(text: str) -> str:
    return "\n".join("> " + _md_escape(line) for line in text.splitlines() or [""])


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _md_cell(text: str) -> str:
    return _md_escape(text).replace("|", "\\|")


def _verdict(c: CitationView) -> str:
    return " (UNVERIFIED)" if not c.verified else " (does not support)" if c.supports is False else ""


def _md_link(c: CitationView) -> str:
    return f"[{c.label}]({c.href})" if c.href else c.label


def summary_table(report: Report) -> tuple[list[DocReport], list[tuple[str, list[Row | None]]]]:
    """The items × documents table a report opens with: (documents, [(item, its row in each
    document)]); empty for a report of one answer."""
    docs = [d for d in report.documents if d.rows]
    if sum(len(d.rows) for d in docs) < 2:
        return [], []
    items = [(r.item_id or _short(r.question, 60), [d.rows[i] if i < len(d.rows) else None for d in docs])
             for i, r in enumerate(docs[0].rows)]
    return docs, items


def _summary_cell(r: Row | None) -> str:
    """One item of one document in the Markdown summary: its status, the answer's start, and
    where its best citation is."""
    if r is None:
        return ""
    best = r.best()
    where = f" ({best.label})" if best and r.status in ("answered", "evidence_only") else ""
    if r.answer and r.status == "answered":
        return f"**answered**: {_md_cell(_short(r.answer, 90))}{where}"
    return f"{r.status.replace('_', ' ')}{where}"


def _md_summary(report: Report) -> list[str]:
    docs, items = summary_table(report)
    if not items:
        return []
    out = ["## Summary", "", "| Item | " + " | ".join(_md_cell(d.name) for d in docs) + " |",
           "| --- |" + " --- |" * len(docs)]
    out += [f"| {_md_cell(item)} | " + " | ".join(_summary_cell(r) for r in rows) + " |" for item, rows in items]
    return out + [""]


# How much of a quote a report shows: of the best citation, and of each further passage (centred
# on the lines that hold the question's words). JSON keeps them whole.
BEST_CHARS, MORE_CHARS = 500, 120


def to_markdown(report: Report) -> str:
    from ..pipelines.answer.query import preview

    out = [f"# {_md_escape(report.title)}", ""]
    if report.checklist:
        out.append(f"Checklist: `{report.checklist}`  ")
    mode = "evidence only (no model)" if report.settings.get("evidence_only") else (
        f"model {model_label(report.settings.get('model')) if report.settings.get('model') else 'default'}")
    out += [f"Mode: {_md_escape(mode)}  ", f"Created: {report.created_at}  ",
            "Counts: " + ", ".join(f"{k} {v}" for k, v in report.counts().items()), ""]
    out += _md_summary(report)
    for d in report.documents:
        where = "removed from the database since" if d.removed else _md_escape(d.path)
        out += [f"## {_md_escape(d.name)}", "", f"`{d.doc_id}` — {where}", ""]
        for r in d.rows:
            head = f"### {_md_escape(r.item_id)} — " if r.item_id else "### "
            out += [head + _md_escape(r.question), ""]
            best = r.best()
            if r.answer and r.status == "answered":
                out += [f"**Answer:** {_md_escape(r.answer)}", ""]
            elif r.status == "evidence_only":
                out += ["**Evidence only** (no model): the best-ranked passage is cited.", ""]
            else:
                out += [f"**{r.status.replace('_', ' ').capitalize()}.**"
                        + (" Closest passage:" if best else ""), ""]
            if best:
                out += [f"Citation: {_md_link(best)} `{best.marker}`{_verdict(best)}", "",
                        _md_quote(preview(best.quote, r.question, BEST_CHARS)), ""]
            if r.draft:
                out += ["Withheld draft (its quotes verify but none supports an answer): "
                        + _md_escape(_short(r.draft, 300)), ""]
            rest = r.rest() + r.draft_citations
            if rest:
                out += [f"<details><summary>Further evidence ({len(rest)})</summary>", ""]
                # labels without links: each would repeat the file's URL (the best citation has it)
                out += [f"- {c.label}{_verdict(c)}: {_md_escape(preview(c.quote, r.question, MORE_CHARS))}"
                        for c in rest]
                out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"


_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ r.title }}</title>
<style>
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin: 2rem 0 .3rem; border-bottom: 2px solid #d9dee7; padding-bottom: .2rem; }
.meta, .docid { color: #5b6475; font-size: .88rem; }
.counts span { display: inline-block; margin-right: .6rem; }
table { border-collapse: collapse; width: 100%; margin-top: .6rem; }
th, td { text-align: left; vertical-align: top; padding: .45rem .55rem; border-bottom: 1px solid #e3e7ee; }
th { background: #f3f5f9; font-size: .85rem; text-transform: uppercase; letter-spacing: .03em; color: #4a5366; }
td.item { width: 22%; } td.answer { width: 50%; white-space: pre-wrap; }
.scroll { overflow-x: auto; } table.summary td { font-size: .86rem; } a.jump { text-decoration: none; }
.best { margin-top: .35rem; white-space: normal; } details summary { cursor: pointer; }
.id { font-family: ui-monospace, Menlo, monospace; font-size: .8rem; color: #5b6475; display: block; }
.badge { display: inline-block; border-radius: 9px; padding: 0 .5rem; font-size: .78rem; font-weight: 600; }
.answered { background: #dff3e4; color: #1b6b34; } .evidence_only { background: #e3ecfa; color: #24508f; }
.not_found { background: #eceef2; color: #4d5566; } .unsupported { background: #fde9d7; color: #8a4a0f; }
.pending { background: #f4f4f4; color: #777; }
tr.conflict td { background: #fff4f4; } tr.conflict .answer { color: #9b1c1c; font-weight: 600; }
ul.cites { list-style: none; margin: 0; padding: 0; }
ul.cites li { margin-bottom: .5rem; }
ul.cites a { font-weight: 600; color: #1f5fbf; text-decoration: none; }
.marker { font-family: ui-monospace, Menlo, monospace; font-size: .78rem; color: #6b7385; }
blockquote { margin: .15rem 0 0; padding: .2rem .6rem; border-left: 3px solid #c7d2e3; background: #f8fafc; white-space: pre-wrap; font-size: .86rem; }
.unverified { color: #b42318; font-weight: 600; }
.muted { color: #8a91a0; }
</style>
</head>
<body>
{% macro cite(c) %}{% if c.href %}<a href="{{ c.href }}">{{ c.label }}</a>{% else %}<b>{{ c.label }}</b>{% endif %} <span class="marker">{{ c.marker }}</span>{% if not c.verified %} <span class="unverified">UNVERIFIED</span>{% elif c.supports == false %} <span class="unverified">does not support</span>{% endif %}{% endmacro %}
<h1>{{ r.title }}</h1>
<div class="meta">
{% if r.checklist %}checklist <b>{{ r.checklist }}</b> · {% endif %}{{ mode }} · created {{ r.created_at }} · {{ r.documents|length }} document(s)
</div>
<div class="meta counts">{% for k, v in r.counts().items() %}<span class="badge {{ k }}">{{ k }} {{ v }}</span>{% endfor %}</div>
{% if items %}
<h2>Summary</h2>
<div class="scroll"><table class="summary">
<thead><tr><th>Item</th>{% for d in docs %}<th>{{ d.name }}</th>{% endfor %}</tr></thead>
<tbody>
{% for item, rows in items %}<tr><td class="item"><span class="id">{{ item }}</span></td>
{% for row in rows %}<td>{% if row %}{% set best = row.best() %}<a class="jump" href="#{{ anchor(docs[loop.index0], row) }}"><span class="badge {{ row.status }}">{{ row.status }}</span></a>
{% if row.answer and row.status == 'answered' %} {{ row.answer | truncate(90) }}{% endif %}{% if best and row.status in ('answered', 'evidence_only') %} <span class="muted">{{ best.label }}</span>{% endif %}{% endif %}</td>{% endfor %}</tr>
{% endfor %}</tbody>
</table></div>
{% endif %}
{% for d in r.documents %}{% if d.rows %}
<h2>{{ d.name }}</h2>
<div class="docid">{{ d.doc_id }} · {{ 'removed from the database since' if d.removed else d.path }}</div>
<table>
<thead><tr><th>Item</th><th>Answer and its best citation</th><th>Further evidence</th></tr></thead>
<tbody>
{% for row in d.rows %}{% set best = row.best() %}{% set rest = row.rest() %}
<tr id="{{ anchor(d, row) }}" class="{{ 'conflict' if row.kind == 'conflict' and row.status == 'answered' else '' }}">
<td class="item">{% if row.item_id %}<span class="id">{{ row.item_id }}{% if row.type %} · {{ row.type }}{% endif %}</span>{% endif %}{{ row.question }}</td>
<td class="answer"><span class="badge {{ row.status }}">{{ row.status }}</span>
{% if row.answer %}{{ row.answer }}{% elif row.status == 'evidence_only' %}<span class="muted">no model: the best-ranked passage</span>{% elif best %}<span class="muted">closest passage</span>{% endif %}
{% if best %}<div class="best">{{ cite(best) }}<blockquote>{{ preview(best.quote, row.question, best_chars) }}</blockquote></div>{% endif %}
{% if row.draft %}<details><summary class="muted">withheld draft (no citation supports it)</summary>{{ row.draft }}{% for c in row.draft_citations %}<blockquote>{{ c.label }}: {{ c.quote | truncate(240) }}</blockquote>{% endfor %}</details>{% endif %}</td>
<td>{% if rest %}<details><summary class="muted">{{ rest|length }} more</summary><ul class="cites">
{% for c in rest %}<li>{{ cite(c) }}<blockquote>{{ preview(c.quote, row.question, more_chars) }}</blockquote></li>
{% endfor %}</ul></details>{% endif %}</td>
</tr>
{% endfor %}
</tbody>
</table>
{% endif %}{% endfor %}
</body>
</html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def to_html(report: Report) -> str:
    from ..pipelines.answer.query import preview

    mode = "evidence only (no model)" if report.settings.get("evidence_only") else (
        f"model {model_label(report.settings.get('model')) if report.settings.get('model') else 'default'}")
    docs, items = summary_table(report)
    return _ENV.from_string(_HTML).render(
        r=report, mode=mode, docs=docs, items=items, preview=preview, best_chars=BEST_CHARS, more_chars=2 * MORE_CHARS,
        anchor=lambda d, row: f"{d.doc_id}-{row.item_id or row.run_id or 'answer'}")


def export(store: Store, ref: str, fmt: Format) -> str:
    if fmt not in FORMATS:
        raise DocqaError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    summary = _summary_of(store, ref)
    if summary is not None:
        return {"md": summary_markdown, "html": summary_html, "json": summary_json}[fmt](summary_view(store, *summary))
    report = build_report(store, ref)
    return {"md": to_markdown, "html": to_html, "json": to_json}[fmt](report)


# -- summaries (`docqa summarize`) -------------------------------------------------------
# A summary is a run with its structure in `summaries`: blocks of sentences, each sentence
# with its citations. Rendered from that structure, with every citation linked to the source.


def _summary_of(store: Store, ref: str):
    """(run, summary) when `ref` names a summary run, else None."""
    from .summarize import get_summary

    row = store.db.execute("SELECT r.id FROM runs r JOIN summaries s ON s.run_id = r.id WHERE r.id = ?"
                           " UNION SELECT r.id FROM runs r JOIN summaries s ON s.run_id = r.id WHERE r.id LIKE ?"
                           " LIMIT 2", [ref, ref + "%"]).fetchall()
    if len(row) != 1:
        return None
    run = get_run(store, row[0][0])
    return run, get_summary(store, run.id)


def summary_view(store: Store, run: Run, summary) -> dict:
    cache: dict = {}
    docs = [{"doc_id": d, "path": store.info(d).path, "title": store.info(d).title} for d in summary.doc_ids]
    blocks = [{"kind": b.kind, "title": b.title, "doc_id": b.doc_id,
               "sentences": [{"text": s.text, "citations": [asdict(_view(store, c, cache)) for c in s.citations]}
                             for s in b.sentences]} for b in summary.blocks]
    return {"kind": "summary", "id": run.id, "title": run.question, "created_at": run.created_at, "model": run.model,
            "length": summary.length, "focus": summary.focus, "documents": docs, "blocks": blocks,
            "dropped_sentences": summary.dropped, "rejected_statements": summary.rejected, "stats": summary.stats}


def summary_markdown(v: dict) -> str:
    out = [f"# {_md_escape(v['title'])}", "", f"Run `{v['id']}` · {v['created_at']} · model "
           f"{_md_escape(model_label(v['model']))}  ",
           "Documents: " + "; ".join(f"`{d['doc_id']}` {_md_escape(d['title'] or Path(d['path']).name)}"
                                     for d in v["documents"]) + "  ",
           f"Every sentence cites verified lines; {v['dropped_sentences']} sentence(s) dropped without a citation.", ""]
    for b in v["blocks"]:
        out += [f"## {_md_escape(b['title'])}", ""]
        for s in b["sentences"]:
            links = " ".join(f"[{c['label']}]({c['href']})" if c["href"] else c["label"] for c in s["citations"])
            out.append(f"- {_md_escape(s['text'])} {links} " + " ".join(f"`{c['marker']}`" for c in s["citations"]))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_SUMMARY_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ v.title }}</title>
<style>
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; margin: 2rem auto; max-width: 980px; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.1rem; margin: 1.6rem 0 .3rem; border-bottom: 2px solid #d9dee7; }
.meta { color: #5b6475; font-size: .88rem; } li { margin-bottom: .45rem; }
a.cite { font-size: .82rem; font-weight: 600; color: #1f5fbf; text-decoration: none; margin-left: .3rem; }
.marker { font-family: ui-monospace, Menlo, monospace; font-size: .75rem; color: #6b7385; }
details { display: inline; } summary { display: inline; cursor: pointer; color: #6b7385; font-size: .78rem; }
blockquote { margin: .2rem 0; padding: .2rem .6rem; border-left: 3px solid #c7d2e3; background: #f8fafc; white-space: pre-wrap; font-size: .86rem; }
.conflicts li { color: #9b1c1c; }
</style>
</head>
<body>
<h1>{{ v.title }}</h1>
<div class="meta">run {{ v.id }} · {{ v.created_at }} · model {{ model }} · {{ v.dropped_sentences }} sentence(s) dropped without a citation</div>
<div class="meta">{% for d in v.documents %}{{ d.doc_id }} {{ d.title or name(d.path) }}{% if not loop.last %} · {% endif %}{% endfor %}</div>
{% for b in v.blocks %}
<h2>{{ b.title }}</h2>
<ul class="{{ b.kind }}">
{% for s in b.sentences %}<li>{{ s.text }}{% for c in s.citations %} {% if c.href %}<a class="cite" href="{{ c.href }}">{{ c.label }}</a>{% else %}<b>{{ c.label }}</b>{% endif %} <span class="marker">{{ c.marker }}</span> <details><summary>quote</summary><blockquote>{{ c.quote | truncate(400) }}</blockquote></details>{% endfor %}</li>
{% endfor %}</ul>
{% endfor %}
</body>
</html>
"""


def summary_html(v: dict) -> str:
    model = model_label(v["model"])
    return _ENV.from_string(_SUMMARY_HTML).render(v=v, model=model, name=lambda p: Path(p).name)


def summary_json(v: dict) -> str:
    return json.dumps(v, ensure_ascii=False, indent=2) + "\n"
