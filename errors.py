"""The one root of docqa's errors, below every layer (pipelines, engine, app import it).

A `DocqaError` is the user's to fix — a file that cannot be ingested, a checkpoint or device
that cannot be used, a document not found, a job asked for twice — and its message is one
complete line: the CLI prints it on stderr and exits 1. Anything else raised is a bug: the
CLI shows one line too, but with DOCQA_DEBUG=1 it raises with its traceback.
"""


class DocqaError(Exception):
    """A user-facing failure whose message is one complete line."""
