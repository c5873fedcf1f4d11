"""Ingesting a path into the store: the one library function `docqa ingest`, `docqa review`
and the Ray executor's workers share.

A file is read and hashed first (`source.load`); content the store already holds is not
parsed again, only its new path recorded. Anything else is parsed into its complete record
(`pipelines.ingest.record.build_record`) and written in one transaction. `ingest_path` does
both in this process; an executor whose workers do not share the database runs
`parse_source` on a worker and `add_record` here (see `review_cli`).

Every path that stores a new document gives each passage its vector for dense retrieval
(`PassageEncoder`, the bundled MiniLM): `docqa ingest` and `docqa review` in this process, a
Ray worker beside its parse, so that the driver, which alone retrieves, never spends its
first question encoding (a minute for a 10-K on one core) while workers wait. A document
stored without them (by `ask FILE`, before vectors existed, or where MiniLM is not installed)
gets them on its first question (`service.Library.dense`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..pipelines.errors import IngestError
from ..pipelines.ingest import SEGMENT_TOKENS
from ..pipelines.ingest.source import Source, detect_type, doc_id_for, load
from . import config

if TYPE_CHECKING:
    import numpy as np

    from ..pipelines.ingest.build import PageProgress
    from ..pipelines.document import Record
    from .store import Store

STDIN = Path("-")  # as a PATH to ingest: read the document from standard input


def read_stdin(max_bytes: int) -> Source:
    """`-` as a file: the document is read from standard input and its type sniffed from its
    bytes (PDF magic, an HTML tag near the start, else text). Recorded with the path `<stdin>`."""
    name = Path("<stdin>")
    data = sys.stdin.buffer.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise IngestError(str(name), f"input too large (the limit is {max_bytes:,} bytes)")
    if not data:
        raise IngestError(str(name), "empty input (0 bytes)")
    head = data[:1024].lstrip().lower()
    ext = ".html" if head.startswith((b"<!doctype html", b"<html", b"<?xml")) or b"<html" in head else ".txt"
    kind = detect_type(name.with_suffix(ext), data)
    doc_id, sha256 = doc_id_for(data)
    return Source(path=name, data=data, type=kind, doc_id=doc_id, sha256=sha256)


def open_source(path: Path, max_bytes: int | None = None) -> Source:
    """The file (or `-`, standard input) read, checked and hashed; `IngestError` if it cannot be."""
    max_bytes = config.max_file_bytes() if max_bytes is None else max_bytes
    return read_stdin(max_bytes) if path == STDIN else load(path, max_bytes=max_bytes)


def add_known(store: Store, source: Source) -> dict | None:
    """For content the store already holds: record this path and say so (no parsing)."""
    if not store.has(source.doc_id):
        return None
    status = store.add_path(source.doc_id, str(source.path))
    info = store.info(source.doc_id)
    return {"doc_id": source.doc_id, "path": str(source.path), "type": info.type, "pages": info.pages,
            "sections": info.sections, "anchors": info.anchors, "segments": info.segments, "status": status}


def add_record(store: Store, source: Source, record: Record) -> dict:
    """Write a parsed record; what `docqa ingest --json` reports of it."""
    doc = record.document
    status = store.add_record(record).status
    out = {"doc_id": source.doc_id, "path": str(source.path), "type": doc.type, "pages": len(doc.pages),
           "sections": len(doc.sections), "anchors": len(doc.anchors), "segments": len(doc.segments)}
    encoding = str((doc.metadata or {}).get("encoding", ""))
    if "replaced" in encoding:  # pipelines/ingest/text.py: mostly UTF-8, a few bytes damaged
        out["warning"] = f"decoded as {encoding}"
    return {**out, "status": status}


class PassageEncoder:
    """The bundled MiniLM sentence encoder for passages (`engine.models.bert`), loaded on first
    use: a command that stores nothing new never loads torch."""

    def __init__(self):
        from ..engine.models.bert_numpy import MAX_LENGTH, MINILM_NAME

        self.name = f"{MINILM_NAME}/{MAX_LENGTH}"
        self._encoder = None

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._encoder is None:
            from ..engine.models.bert import load_minilm

            self._encoder = load_minilm()
            assert self._encoder.name == self.name, (self._encoder.name, self.name)
        return self._encoder.encode(texts)


def passage_encoder() -> PassageEncoder | None:
    """The passage encoder, or None where the MiniLM package is not installed (documents are
    then stored without vectors, and search is lexical)."""
    from ..engine.config import CheckpointError
    from ..engine.models.bert_numpy import minilm_folder

    try:
        minilm_folder()
    except CheckpointError:
        return None
    return PassageEncoder()


def build_record(source: Source, *, segment_tokens: int = SEGMENT_TOKENS, on_page: PageProgress | None = None,
                 encoder: PassageEncoder | None = None) -> Record:
    # Imported on first use: `docqa --help` must not load the parsers (bench/startup.py).
    from ..pipelines.ingest.record import build_record

    return build_record(source, segment_tokens=segment_tokens, on_page=on_page, encoder=encoder)


def ingest_path(store: Store, path: Path, *, max_bytes: int | None = None, segment_tokens: int = SEGMENT_TOKENS,
                on_page: PageProgress | None = None, encoder: PassageEncoder | None = None) -> dict:
    """Ingest one file (or `-`) into `store`: its summary (doc id, path, type, counts, status
    "added" / "already ingested" / "new path"). `on_page(step, done, total)` while a PDF's
    pages are read and while passages are encoded (`encoder`: None stores no vectors).
    Raises `IngestError` for a file that cannot be ingested; the store is then unchanged."""
    source = open_source(path, max_bytes)
    known = add_known(store, source)
    if known is not None:
        return known
    record = build_record(source, segment_tokens=segment_tokens, on_page=on_page, encoder=encoder)
    return add_record(store, source, record)


def parse_source(source: Source) -> dict:
    """On a worker that does not share the database: a loaded file parsed (OCR included) into
    its record with its passage vectors, or the one-line error; the driver writes it with
    `add_record`. The encoder is loaded per task: its load is a small part of encoding a
    document, and a worker keeps no state between tasks."""
    try:
        return {"record": build_record(source, encoder=passage_encoder())}
    except IngestError as e:
        return {"error": str(e)}


def resolve_or_ingest(store: Store, refs: list[str], on_file: Callable[[Path], None] | None = None) -> list[str]:
    """The doc ids of `ask`'s and `chat`'s documents: a reference the store does not know that
    names a file on disk is ingested first (as `review` does with new files; `on_file(path)`
    before each); any other resolves, or fails, as `Store.resolve` says."""
    from .errors import DocumentNotFound

    ids = []
    for ref in refs:
        try:
            ids.append(store.resolve(ref))
        except DocumentNotFound:
            path = Path(ref).expanduser()
            if not path.is_file():
                raise
            if on_file:
                on_file(path)
            ids.append(ingest_path(store, path)["doc_id"])
    return ids
