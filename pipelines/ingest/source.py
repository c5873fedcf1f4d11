"""A file read into memory and identified (size, type, content hash) before any parsing,
so a caller can skip parsing content it already holds."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..document import DocType
from ..errors import IngestError

DEFAULT_MAX_BYTES = 200 * 1024 * 1024

EXTENSIONS: dict[str, DocType] = {
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
}


def doc_id_for(data: bytes) -> tuple[str, str]:
    """(doc_id, sha256): the id is the first 12 hex digits of the content hash."""
    digest = hashlib.sha256(data).hexdigest()
    return digest[:12], digest


def detect_type(path: Path, data: bytes) -> DocType:
    """The extension decides, except that PDF magic bytes win (PDFs are often saved without
    an extension) and a `.pdf` without them is refused here rather than deep in the parser."""
    # The PDF spec lets the header sit anywhere in the first 1024 bytes.
    is_pdf = b"%PDF-" in data[:1024]
    ext = path.suffix.lower()
    if ext == ".pdf" and not is_pdf:
        raise IngestError(str(path), "not a PDF file (no %PDF header); corrupt or mislabelled")
    if is_pdf:
        return "pdf"
    if ext in EXTENSIONS:
        return EXTENSIONS[ext]
    shown = ext or "(no extension)"
    supported = ", ".join(sorted(EXTENSIONS))
    raise IngestError(str(path), f"unsupported file type '{shown}' (supported: {supported})")


@dataclass(frozen=True)
class Source:
    """A file read into memory and identified, before any parsing."""

    path: Path
    data: bytes
    type: DocType
    doc_id: str
    sha256: str


def load(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Source:
    """Read one file once, check its size and type, and hash it (cheap; no parsing), so a
    caller can skip parsing content it already has."""
    path = Path(path).expanduser().resolve()
    name = str(path)
    if path.is_dir():
        raise IngestError(name, "is a folder, not a file")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise IngestError(name, "no such file") from None
    except OSError as e:
        raise IngestError(name, f"cannot read: {e.strerror or e}") from None
    # Checked before reading so a huge file never lands in memory.
    if size > max_bytes:
        raise IngestError(name, f"file too large ({size:,} bytes; the limit is {max_bytes:,})")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise IngestError(name, f"cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:  # grew between stat and read
        raise IngestError(name, f"file too large (the limit is {max_bytes:,} bytes)")
    if not data:
        raise IngestError(name, "empty file (0 bytes)")
    kind = detect_type(path, data)
    doc_id, sha256 = doc_id_for(data)
    return Source(path=path, data=data, type=kind, doc_id=doc_id, sha256=sha256)
