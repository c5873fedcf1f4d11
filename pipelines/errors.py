"""Typed errors of the document pipelines, under the one root (errors.py); the CLI turns
them into one line on stderr."""

from ..errors import DocqaError


class IngestError(DocqaError):
    """A file that cannot be ingested. The message names the file and says why, in one line."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
