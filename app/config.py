"""Where things live and the few limits a user may override, read from the environment."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import DocqaError

DEFAULT_MAX_FILE_BYTES = 200 * 1024 * 1024
BUSY_TIMEOUT_S = 10.0


def default_db_path() -> Path:
    """`DOCQA_DB`, else `$XDG_DATA_HOME/docqa/docqa.db` (XDG default ~/.local/share)."""
    env = os.environ.get("DOCQA_DB")
    if env:
        return Path(env).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "docqa" / "docqa.db"


def max_file_bytes() -> int:
    """The ingest size limit; `DOCQA_MAX_FILE_BYTES` lowers or raises it (tests use a tiny one)."""
    env = os.environ.get("DOCQA_MAX_FILE_BYTES")
    if env:
        try:
            value = int(env)
        except ValueError:
            raise DocqaError(
                f"DOCQA_MAX_FILE_BYTES must be a whole number of bytes, not {env!r}"
            ) from None
        if value <= 0:
            raise DocqaError("DOCQA_MAX_FILE_BYTES must be positive")
        return value
    return DEFAULT_MAX_FILE_BYTES


def debug() -> bool:
    """`DOCQA_DEBUG=1` lets unexpected exceptions raise with their traceback."""
    return os.environ.get("DOCQA_DEBUG", "") not in ("", "0", "false", "no")
