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
# HTTP status (app/serve.py), and the batch runner's cancellation of a request whose client went
# away (engine/batch.py, caught where the request is finished).
INTERNAL = {"docqa.app.serve.RequestError", "docqa.app.serve.ClientGone", "docqa.app.serve.Busy",
            "docqa.app.serve._TooLarge", "docqa.engine.batch._Cancelled"}


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


@pytest.mark.parametrize("name, value, says", [
    ("DOCQA_THREADS", "abc", "DOCQA_THREADS must be a whole number of threads, 1 or more, not 'abc'"),
    ("DOCQA_THREADS", "0", "DOCQA_THREADS must be a whole number of threads, 1 or more, not '0'"),
    ("DOCQA_DEVICE", "gpu", "DOCQA_DEVICE must be cpu, cuda, cuda:N or auto, not 'gpu'"),
    ("DOCQA_MAX_FILE_BYTES", "1e6", "DOCQA_MAX_FILE_BYTES must be a whole number of bytes, not '1e6'"),
])
def test_a_bad_variable_is_named_when_a_command_starts(tmp_path, name, value, says):
    """Issue 31 item 16: DOCQA_THREADS=abc was an unexpected ValueError, and only once a model
    ran; now every command names the variable before doing anything (no database made)."""
    db = tmp_path / "d.db"
    for args in (["docs"], ["ask", "x.pdf", "Which law governs?"], ["engine", "generate", "hi"]):
        res = CliRunner().invoke(app, [*args, "--db", str(db)] if args[0] != "engine" else args,
                                 env={name: value, "DOCQA_DEBUG": "1"})
        assert res.exit_code == 1 and res.stderr == f"error: {says}\n", (args, res.output)
    assert not db.exists()


def test_a_missing_shard_names_the_checkpoint_and_the_file(tmp_path):
    """Issue 31 item 4: a sharded HF checkpoint with a shard gone was `unexpected KeyError:
    'layers.1.…'`; now one line names the checkpoint and the missing file, before loading."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    shards[1].unlink()
    res = CliRunner().invoke(app, ["engine", "generate", "hi", "--model", str(tmp_path)], env={"DOCQA_DEBUG": "1"})
    assert res.exit_code == 1
    assert res.stderr == (f"error: checkpoint {tmp_path} is incomplete: model.safetensors.index.json lists "
                          f"{len(shards)} weight files and 1 of them are missing ({shards[1].name})\n")
    # Without the index the model's own check says which tensors are missing, naming the checkpoint.
    (tmp_path / "model.safetensors.index.json").unlink()
    res = CliRunner().invoke(app, ["engine", "generate", "hi", "--model", str(tmp_path)], env={"DOCQA_DEBUG": "1"})
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"error: checkpoint {tmp_path} does not hold the weights its config describes: "
                                 "checkpoint does not fit the model: missing ")
