"""Typed errors of the app layer, under the one root `DocqaError` (errors.py, which the
pipelines' `IngestError` and the engine's `CheckpointError` / `DeviceError` share): the CLI
prints any of them as one line on stderr and exits non-zero; anything else is a bug."""

from __future__ import annotations

from ..errors import DocqaError

__all__ = ["DocqaError", "DocumentNotFound", "AmbiguousDocument", "PageOutOfRange", "StoreError"]


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
