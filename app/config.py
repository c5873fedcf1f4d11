"""The app's settings from the environment: every `DOCQA_*` / `XDG_*` variable the app layer
reads is read here, and nowhere else (the engine's are read in engine/environment.py).

    DOCQA_DB               the database file (else $XDG_DATA_HOME/docqa/docqa.db)
    DOCQA_MAX_FILE_BYTES   the ingest size limit (else pipelines.ingest's DEFAULT_MAX_BYTES)
    DOCQA_MODEL            the model `ask` uses: a checkpoint or openai:URL#MODEL (else the default)
    DOCQA_OPENAI_API_KEY   the bearer token for a model server started with an API key
    DOCQA_DEBUG            unexpected exceptions raise with their traceback
"""

from __future__ import annotations

import os
from pathlib import Path

from ..pipelines.ingest import DEFAULT_MAX_BYTES
from .errors import DocqaError

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
    return DEFAULT_MAX_BYTES


def debug() -> bool:
    """`DOCQA_DEBUG=1` lets unexpected exceptions raise with their traceback."""
    return os.environ.get("DOCQA_DEBUG", "") not in ("", "0", "false", "no")


def model_spec(model: str | None) -> str | None:
    """The model asked for: `--model`, else `DOCQA_MODEL`, else None (the default model)."""
    return model or os.environ.get("DOCQA_MODEL") or None


def openai_api_key() -> str | None:
    """`DOCQA_OPENAI_API_KEY`: the bearer token for model servers started with an API key."""
    return os.environ.get("DOCQA_OPENAI_API_KEY") or None
