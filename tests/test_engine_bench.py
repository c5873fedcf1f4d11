"""`docqa engine bench` on the CPU, as the README shows it: the plain figures and the
long-document path (`--context N`), with the default model and with a tiny HF checkpoint
written by transformers. The reference is the SPEC's `--json` contract (§3)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_engine_vs_hf import make_tiny_hf_dir  # noqa: E402


def _bench(*args: str) -> dict:
    r = CliRunner().invoke(app, ["engine", "bench", "--device", "cpu", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _check_context_figures(res: dict, context: int) -> None:
    assert res["context"] == context and res["device"] == "cpu"
    for key in ("prefill_s", "first_token_s", "decode_ms_per_token", "peak_memory_gib"):
        assert res[key] > 0, key
    assert res["state"] == "SparseKVState" and res["dtype"] == "float32" and res["model"]


@pytest.mark.slow  # loading and reading the default model: tens of seconds on a loaded 2-core CPU
def test_context_bench_with_the_default_model():
    _check_context_figures(_bench("--context", "128", "--decode-tokens", "4"), 128)


def test_context_bench_with_a_tiny_hf_checkpoint(tmp_path):
    make_tiny_hf_dir(tmp_path, "llama")
    _check_context_figures(_bench("--model", str(tmp_path), "--context", "160", "--decode-tokens", "4"), 160)
