"""Typed errors of the app layer. The CLI prints any `DocqaError` (and the pipelines'
`IngestError`) as one line on stderr and exits non-zero; anything else is a bug."""

from __future__ import annotations


class DocqaError(Exception):
    """A user-facing failure whose message is one complete line."""


class DocumentNotFound(DocqaError):
    def __init__(self, ref: str):
        super().__init__(f"no ingested document matches '{ref}' (see `docqa docs`)")
        self.ref = ref


class AmbiguousDocument(DocqaError):
    def __init__(self, ref: str, candidates: list[str]):
        shown = ", ".join(candidates[:5]) + (", ..." if len(candidates) > 5 else "")
        super().__init__(f"'{ref}' matches several documents ({shown}); give more of the id")
        self.ref = ref
        self.candidates = candidates


class PageOutOfRange(DocqaError):
    def __init__(self, doc_id: str, page: int, pages: int):
        super().__init__(f"document {doc_id} has pages 1..{pages}; there is no page {page}")


class StoreError(DocqaError):
    """The database file cannot be opened or is not a docqa database."""
