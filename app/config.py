"""The app's settings from the environment: every `DOCQA_*` / `XDG_*` variable the app layer
reads is read here, and nowhere else (the engine's are read in engine/settings.py).

    DOCQA_DB               the database file (else $XDG_DATA_HOME/docqa/docqa.db)
    DOCQA_MAX_FILE_BYTES   the ingest size limit (else pipelines/ingest/source.py's DEFAULT_MAX_BYTES)
    DOCQA_MODEL            the model `ask` uses: a checkpoint or openai:URL#MODEL (else the default)
    DOCQA_OPENAI_API_KEY   the bearer token for a model server started with an API key
    DOCQA_DEBUG            unexpected exceptions raise with their traceback

and `AskSettings`, the settings of one answer, whose defaults the CLI's options show.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DocqaError

# How long a write waits for another process's write to finish before saying the database is
# busy (README, "Using it"): a long ingest or review holds the lock only while it stores each
# record or answer, so more than a minute means something else holds it.
BUSY_TIMEOUT_S = 60.0


def default_db_path() -> Path:
    """`DOCQA_DB`, else `$XDG_DATA_HOME/docqa/docqa.db` (XDG default ~/.local/share)."""
    env = os.environ.get("DOCQA_DB")
    if env:
        return Path(env).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "docqa" / "docqa.db"


def max_file_bytes() -> int:
    """The ingest size limit; `DOCQA_MAX_FILE_BYTES` lowers or raises it (tests use a tiny one)."""
    from ..pipelines.ingest.source import DEFAULT_MAX_BYTES  # not at import: it loads the document models

    return _env_max_file_bytes() or DEFAULT_MAX_BYTES


def _env_max_file_bytes() -> int | None:
    env = os.environ.get("DOCQA_MAX_FILE_BYTES")
    if not env:
        return None
    try:
        value = int(env)
    except ValueError:
        raise DocqaError(f"DOCQA_MAX_FILE_BYTES must be a whole number of bytes, not {env!r}") from None
    if value <= 0:
        raise DocqaError("DOCQA_MAX_FILE_BYTES must be positive")
    return value


def check_environment() -> None:
    """Every variable with a value to check, the app's and the engine's, read once when a
    command starts: a bad one is one line naming it before any work, not a failure later."""
    from ..engine.settings import check_environment as check_engine

    _env_max_file_bytes()
    check_engine()


def debug() -> bool:
    """`DOCQA_DEBUG=1` lets unexpected exceptions raise with their traceback."""
    return os.environ.get("DOCQA_DEBUG", "") not in ("", "0", "false", "no")


def model_spec(model: str | None) -> str | None:
    """The model asked for: `--model`, else `DOCQA_MODEL`, else None (the default model)."""
    return model or os.environ.get("DOCQA_MODEL") or None


def openai_api_key() -> str | None:
    """`DOCQA_OPENAI_API_KEY`: the bearer token for model servers started with an API key."""
    return os.environ.get("DOCQA_OPENAI_API_KEY") or None


ABSTAIN_MARGIN = 0.0


@dataclass(frozen=True)
class AskSettings:
    model: str | None = None  # checkpoint path or openai:URL#MODEL; None: DOCQA_MODEL, else the default model
    evidence_only: bool = False
    passages: int = 8  # ranked passages offered to the context builder
    evidence: int = 5  # passages shown as evidence
    # Context budget: prefill dominates an answer's time on a CPU (~100-300 tokens/s with the
    # default model), so a few clauses' worth; raise it for a GPU or a longer-context model.
    budget_tokens: int = 1600
    max_tokens: int = 200
    temperature: float = 0.0
    read_all: bool = False  # the engine reads the whole document (sparse attention + prefix cache)
    # Quote-constrained answers (pipelines/quote_constraint.py): the model picks the passage and
    # the words, decoding keeps them exact quotes. Free text suits models that quote unaided;
    # the default 135M model paraphrases, so none of its free-text citations verify.
    quote: bool = True
    device: str | None = None  # cpu, cuda, cuda:N, auto; None: DOCQA_DEVICE, else auto
    # Quotes from only this many best-ranked passages (None: any passage read). Measured at 3:
    # the gold page among the answer's citations 7/18, as with None (bench/results/ask.md).
    quote_from: int | None = None
    # Abstention (bench/results/ask.md). The model quotes only when its log-odds of opening a
    # quote over "Not found in the document." exceed `abstain_margin` (0: its bare preference).
    abstain_margin: float = ABSTAIN_MARGIN
    # An answer none of whose verified quotes supports it (names the question's subject; for a
    # numeric question, holds a figure of the kind and year asked) is withheld as "not found",
    # with the evidence shown (pipelines/support.py).
    subject_check: bool = True
    # Thinking controls for reasoning models, passed to the chat template as enable_thinking /
    # reasoning_effort (engine/chat.py; None: the template's own default). A model that thinks
    # gets THINK_TOKENS (app/models.py) more to generate, and its thinking is never part of the answer.
    thinking: bool | None = None
    reasoning_effort: str | None = None
