"""Typed errors of the app layer, under the one root `DocqaError` (errors.py, which the
pipelines' `IngestError` and the engine's `CheckpointError` / `DeviceError` share): the CLI
prints any of them as one line on stderr and exits non-zero; anything else is a bug."""

from __future__ import annotations

import shlex

from ..errors import DocqaError

__all__ = ["DocqaError", "DocumentNotFound", "AmbiguousDocument", "PageOutOfRange", "StoreError", "StoreBusy",
           "StoreDamaged"]


class DocumentNotFound(DocqaError):
    def __init__(self, ref: str):
        # A reference that names a file path (a folder or an extension in it) is most likely a
        # mistyped path: say that the file is missing too, not only that nothing was ingested.
        looks_like_path = "/" in ref or "\\" in ref or "." in ref.rsplit("/", 1)[-1]
        super().__init__(f"no ingested document matches '{ref}'"
                         + (" and no such file exists" if looks_like_path else "") + " (see `docqa docs`)")
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


class StoreBusy(StoreError):
    """Another process has held the database's write lock for longer than we wait."""

    def __init__(self, path, waited_s: float):
        super().__init__(f"database {path} is busy: another process has been writing to it for over "
                         f"{waited_s:.0f} s; try again when it has finished")


class StoreDamaged(StoreError):
    """SQLite's own check finds the file damaged: docqa reads it with a warning, never writes."""

    def __init__(self, path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"database {path} is damaged ({problem}); docqa will not write to it. Save what "
                         f"it still holds with: sqlite3 {shlex.quote(str(path))} .recover | sqlite3 recovered.db")
