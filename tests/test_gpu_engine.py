"""One engine API on CPU and GPU: device choice, and the default model's greedy text on CUDA
against the CPU (dense attention and the Triton sparse state). The CUDA tests are skipped
cleanly where torch sees no GPU; the device-choice tests run everywhere. The model is
`DOCQA_MODEL` when set (a GPU machine may hold the same GGUF file elsewhere), else the
bundled default."""

from __future__ import annotations

import pytest
import torch
from docqa.engine import Engine
from docqa.engine.default_model import resolve_model_path
from docqa.engine.device import DeviceError, resolve_device
from docqa.engine.settings import EngineSettings
from docqa.engine.sparse_state import SparseKVState
from docqa.kernels.gpu import has_cuda, has_triton

cuda = pytest.mark.skipif(not (has_cuda() and has_triton()), reason="needs a CUDA device and triton")

PROMPTS = [
    "What does a force majeure clause do in a supply contract?",
    "Summarise the duties of a franchisee in two sentences.",
    "List three reasons a licence agreement may be terminated.",
]
TOKENS = 64


def test_auto_device_follows_torch(monkeypatch):
    monkeypatch.delenv("DOCQA_DEVICE", raising=False)
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("DOCQA_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")


def test_bad_device_choices_are_one_clear_error():
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("tpu-ish!")
    with pytest.raises(DeviceError, match="unsupported device"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):
            resolve_device("cuda")


def test_cli_device_flag_reports_a_missing_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the flag would succeed")
    from docqa.app.cli import app
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["engine", "generate", "hi", "--device", "cuda", "-n", "2"])
    assert res.exit_code == 1
    assert "no CUDA device" in res.output and "Traceback" not in res.output


@pytest.fixture(scope="module")
def cpu_engine():
    return Engine.load(resolve_model_path(None), device="cpu", decode_weights="fp32")


def test_sparse_state_on_cpu_is_the_reference_state(cpu_engine):
    assert isinstance(cpu_engine.new_sparse_state(), SparseKVState)
    assert cpu_engine.new_sparse_state().cache.device == torch.device("cpu")


@cuda
def test_default_model_same_greedy_text_on_gpu_as_on_cpu(cpu_engine):
    gpu = Engine.load(resolve_model_path(None), device="cuda", decode_weights="fp32")
    assert gpu.device.type == "cuda"
    for text in PROMPTS:
        ids = cpu_engine.chat_prompt(text)
        want = cpu_engine.generate(ids, TOKENS, stop_ids=())
        got = gpu.generate(ids, TOKENS, stop_ids=())
        assert got.token_ids == want.token_ids, (text, got.text, want.text)
        logits_cpu = cpu_engine.model(torch.tensor(ids), cpu_engine.new_state())
        logits_gpu = gpu.model(torch.tensor(ids, device="cuda"), gpu.new_state()).cpu()
        assert (logits_gpu - logits_cpu).abs().max() < 1e-3


@cuda
def test_triton_sparse_state_matches_cpu_sparse_state(cpu_engine):
    """A prompt past `dense_below`, so blocks are routed: the Triton state on the GPU against the
    PyTorch reference state on the CPU, same settings (true positions: what Triton serves)."""
    from docqa.engine.gpu.state import TritonKVState

    gpu = Engine.load(resolve_model_path(None), device="cuda", decode_weights="fp32")
    settings = EngineSettings(positions="true", dense_below=0, window=256, top_k=4, chunk_size=256,
                              route_chunk=256)
    ids = cpu_engine.chat_prompt(" ".join(PROMPTS * 40))
    assert len(ids) > settings.budget  # routing really chooses
    state_gpu = gpu.new_sparse_state(settings)
    assert isinstance(state_gpu, TritonKVState)
    cpu_engine.prefill_chunk = gpu.prefill_chunk = settings.chunk_size
    want = cpu_engine.generate(ids, 32, state=cpu_engine.new_sparse_state(settings), stop_ids=())
    got = gpu.generate(ids, 32, state=state_gpu, stop_ids=())
    assert got.token_ids == want.token_ids, (got.text, want.text)
