"""Settings and errors under one roof (issue 18): the environment is read in one module per
layer, every error a user can cause is a `DocqaError` (one line, exit 1), and a bug in the
engine still raises with its traceback under DOCQA_DEBUG instead of passing for a user error."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import docqa
from docqa.app.cli import app
from docqa.errors import DocqaError

ROOT = Path(docqa.__file__).resolve().parent
# The one module per layer that reads the environment.
READERS = {"app": "app/config.py", "engine": "engine/settings.py", "pipelines": None}


def _env_reads(path: Path) -> list[str]:
    """The DOCQA_* / XDG_* names a module reads (os.environ.get / [] / getenv)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            arg = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            arg = node.slice
        else:
            continue
        if isinstance(arg, ast.Constant) and re.match(r"(DOCQA|XDG)_", str(arg.value)):
            names.append(arg.value)
    return names


@pytest.mark.parametrize("layer", sorted(READERS))
def test_each_layer_reads_the_environment_in_one_module(layer):
    readers = {str(p.relative_to(ROOT)): _env_reads(p) for p in (ROOT / layer).rglob("*.py")}
    readers = {p: names for p, names in readers.items() if names}
    assert set(readers) == ({READERS[layer]} if READERS[layer] else set()), readers


def _docqa_exceptions() -> list[type]:
    found = {}
    for top in ("app", "engine", "pipelines"):
        pkg = importlib.import_module(f"docqa.{top}")
        for info in pkgutil.walk_packages(pkg.__path__, f"docqa.{top}."):
            if ".gpu" in info.name:
                continue  # the CUDA path (needs triton); its errors are checks of its own calls
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # an optional extra that is not installed
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, Exception) and cls.__module__.startswith("docqa."):
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


# Exceptions that never reach a user: the model server's per-request failures, answered as an
# HTTP status (app/serve.py).
INTERNAL = {"docqa.app.serve.RequestError", "docqa.app.serve.ClientGone"}


def test_every_error_of_ours_is_a_docqa_error():
    classes = _docqa_exceptions()
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    assert {"docqa.pipelines.errors.IngestError", "docqa.engine.config.CheckpointError",
            "docqa.engine.device.DeviceError", "docqa.app.errors.StoreError"} <= names
    strays = sorted(n for c, n in ((c, f"{c.__module__}.{c.__qualname__}") for c in classes)
                    if n not in INTERNAL and not issubclass(c, DocqaError))
    assert strays == []


def test_engine_user_error_is_one_line_and_a_bug_raises_under_debug(tmp_path, monkeypatch):
    missing = tmp_path / "nope.gguf"
    for env in ({"DOCQA_DEBUG": None}, {"DOCQA_DEBUG": "1"}):  # a user's error: one line either way
        res = CliRunner().invoke(app, ["engine", "generate", "hi", "--model", str(missing)], env=env)
        assert res.exit_code == 1 and res.stderr.strip() == f"error: model {missing} does not exist"

    from docqa.engine.generate import Engine

    def broken(*args, **kwargs):
        raise ValueError("an engine bug")

    monkeypatch.setattr(Engine, "load", broken)
    res = CliRunner().invoke(app, ["engine", "generate", "hi"], env={"DOCQA_DEBUG": "1"})
    assert isinstance(res.exception, ValueError) and str(res.exception) == "an engine bug"
    res = CliRunner().invoke(app, ["engine", "generate", "hi"], env={"DOCQA_DEBUG": None})
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: unexpected ValueError: an engine bug (DOCQA_DEBUG=1 shows the traceback)"
