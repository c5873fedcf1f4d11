"""MTP speculative decoding on the engine's Triton decoders: GLM-4.5 (`glm4_moe`) on
`CudaDecoder` (engine/gpu/model.py), GLM-4.7-Flash (`glm4_moe_lite`) and GLM-5 (`glm_moe_dsa`)
on `GlmCudaDecoder` (engine/gpu/glm.py), each a tiny random checkpoint written by transformers
5.24 with a random MTP layer beside it (tests/test_glm_mtp.py `add_mtp_layer`).

The main model verifies [token, draft] in one prefill and the state forgets a rejected draft:
the tokens are transformers' greedy `generate` (which ignores the MTP layer) and the same
engine's plain graphed greedy loop; drafts forced right and wrong in turn run both branches.

Without a GPU the same code runs on CPU tensors under TRITON_INTERPRET=1 (`kernels="triton"`);
there each plain decode step costs seconds, so the runs that need many are -m slow on the CPU
and run by default on a GPU."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_glm import VOCAB, make_tiny_glm, write_glm_tokenizer  # noqa: E402
from test_glm_mtp import add_mtp_layer  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("few_moe_configs"),
              pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")]
DEV = "cuda" if has_cuda() else "cpu"
SLOW_ON_CPU = [] if has_cuda() else [pytest.mark.slow]
TOL = 1e-3 if has_cuda() else 1e-4  # as tests/test_cuda_glm4.py: Triton's fp32 dots run in TF32 on the GPU
DECODER = {"glm4_moe": "CudaDecoder", "glm4_moe_lite": "GlmCudaDecoder", "glm_moe_dsa": "GlmCudaDecoder"}
# under the interpreter GLM-4.5's and GLM-5's verify prefills cost ~1-2 s each (GLM-4.7-Flash's ~0.3 s)
KINDS = ["glm4_moe", "glm4_moe_lite", pytest.param("glm_moe_dsa", marks=SLOW_ON_CPU)]
NEW = 12


def mtp_engine(path, kind: str):
    """transformers' model, our Triton engine over the same checkpoint plus an MTP layer, and
    a 30-token prompt (GLM-5's indexer top-k is 24: it selects)."""
    from docqa.engine import Engine

    ref = make_tiny_glm(path, kind)
    add_mtp_layer(path)
    write_glm_tokenizer(path)
    engine = Engine.load(path, device=DEV, kernels="triton", dtype=torch.float32)
    assert engine.triton and type(engine.model).__name__ == DECODER[kind]
    assert engine.mtp_layer is None  # off by default on the Triton decoders (Engine.speculative)
    engine.speculative = True
    prompt = torch.randint(2, VOCAB, (30,), generator=torch.Generator().manual_seed(7)).tolist()
    return ref, engine, prompt


def hf_greedy(ref, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_triton_speculative_generate_equals_transformers_greedy(tmp_path, kind):
    """Engine.generate drafts with the MTP layer on the Triton decoder (acceptance reported)
    and gives transformers' greedy tokens; the state holds exactly the kept tokens' KV (a fresh
    prefill of them gives the same rows, so every rejected draft was forgotten)."""
    ref, engine, prompt = mtp_engine(tmp_path, kind)
    want = hf_greedy(ref, prompt, NEW)
    state = engine.new_state(64)
    streamed = []
    res = engine.generate(prompt, NEW, state=state, stop_ids=(), on_token=lambda tok, _d: streamed.append(tok))
    assert res.token_ids == want and streamed == want and res.stop_reason == "length"
    spec = res.speculative
    assert spec is not None and spec["steps"] > 0 and spec["drafted"] == spec["steps"]
    # each verify forward yields its own token plus the draft when accepted; prefill gives the first
    assert len(want) - 1 <= spec["steps"] + spec["accepted"] <= len(want)
    assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted"] / spec["steps"])

    n = len(prompt) + len(want) - 1  # every kept token but the last was fed to the model
    assert state.num_tokens >= n
    fresh = engine.new_state(64)
    engine.prefill(prompt + want[:-1], fresh)
    rows = [(state.kv, fresh.kv)] if hasattr(state, "kv") else [(state.k, fresh.k), (state.v, fresh.v)]
    if getattr(state, "dsa", False):
        rows.append((state.ik, fresh.ik))  # GLM-5's indexer keys
    for got, want_rows in rows:
        want_rows = want_rows[:, :n]
        assert (got[:, :n] - want_rows).abs().max().item() < TOL * max(1.0, want_rows.abs().max().item())


@pytest.mark.parametrize("kind", ["glm4_moe_lite", pytest.param("glm4_moe", marks=SLOW_ON_CPU),
                                  pytest.param("glm_moe_dsa", marks=SLOW_ON_CPU)])
def test_triton_forced_drafts_accepted_and_rejected_equal_transformers_greedy(tmp_path, kind):
    """Drafts forced right on every other step and wrong otherwise (a random MTP layer's are
    mostly wrong): the accept branch (two tokens kept) and the reject branch (the draft's KV
    truncated away) alternate on the Triton state, and the tokens stay transformers' greedy."""
    from docqa.engine.models.mtp import _Take, speculative_decode

    ref, engine, prompt = mtp_engine(tmp_path, kind)
    want = hf_greedy(ref, prompt, NEW)
    calls = []

    def draft(out):
        calls.append(1)
        nxt = want[len(out)] if len(out) < len(want) else 0
        return nxt if len(calls) % 2 else (nxt + 1) % VOCAB

    take = _Take(NEW, set())
    steps, drafted, accepted = speculative_decode(
        engine._hidden_forward, engine.new_state(64), torch.tensor(prompt, device=DEV), take, mtp=None,
        out=take.out, draft=draft)
    assert take.out == want
    assert drafted == steps == len(calls) and accepted == (drafted + 1) // 2 > 1


@pytest.mark.parametrize("kind", [pytest.param(k, marks=SLOW_ON_CPU) for k in DECODER])
def test_triton_speculative_equals_the_same_engines_plain_greedy(tmp_path, kind):
    """With speculation off the engine decodes one token per step (the graphed loop on CUDA):
    the same tokens, and no speculation reported."""
    _, engine, prompt = mtp_engine(tmp_path, kind)
    spec = engine.generate(prompt, NEW, stop_ids=())
    engine.speculative = False
    plain = engine.generate(prompt, NEW, stop_ids=())
    assert spec.speculative is not None and plain.speculative is None
    assert spec.token_ids == plain.token_ids


@pytest.mark.parametrize("kind", KINDS)
def test_triton_speculates_only_where_a_prefill_verifies_as_decode_attends(tmp_path, kind):
    """Under the engine's sparse settings the Triton prefill routes blocks per routing chunk and
    decode per token, so a verify prefill could keep a token plain decoding would not: those
    states decode one token per step. GLM-5's indexer picks per query in both: it speculates."""
    _, engine, prompt = mtp_engine(tmp_path, kind)
    prompt = prompt[:8]
    state = engine.new_state(64, engine.sparse_settings())
    res = engine.generate(prompt, 1, state=state, stop_ids=())  # one token: prefill only, no decode step
    assert (res.speculative is not None) == (kind == "glm_moe_dsa")
    assert engine.generate(prompt, 1, stop_ids=()).speculative is not None  # the dense state speculates


@pytest.mark.parametrize("kind", [pytest.param("glm4_moe_lite", marks=SLOW_ON_CPU)])  # ~2 min under the interpreter
def test_triton_speculative_on_an_fp8_checkpoint(tmp_path, kind):
    """An FP8 GLM-4.7-Flash checkpoint whose MTP layer is stored block-scaled too: the decoder
    keeps the main matrices e4m3 and the MTP layer dequantised, whose drafts are the PyTorch
    path's (engine/models/fp8.py dequantises the whole checkpoint there); the tokens are
    transformers' greedy decoding on the dequantised weights."""
    from safetensors import safe_open
    from test_cuda_glm import write_fp8_glm

    from docqa.engine import Engine
    from docqa.engine.checkpoint import load_model
    from docqa.engine.models.mtp import MTPLayer
    from docqa.kernels.linear.naive_fp8 import Fp8Weight

    ref, path = write_fp8_glm(tmp_path, kind)
    add_mtp_layer(path)  # the last layer's names and shapes: FP8 matrices with their block scales
    write_glm_tokenizer(path)
    with safe_open(str(path / "model-mtp.safetensors"), "pt") as f:
        assert any(k.endswith("eh_proj.weight") for k in f.keys())
        assert any(k.endswith("mlp.experts.0.down_proj.weight_scale_inv") for k in f.keys())
    engine = Engine.load(path, device=DEV, kernels="triton", dtype=torch.float32)
    assert isinstance(engine.model.layers[1].wo, Fp8Weight)
    engine.speculative = True  # off by default on the Triton decoders
    prompt = torch.randint(2, VOCAB, (30,), generator=torch.Generator().manual_seed(7)).tolist()
    res = engine.generate(prompt, NEW, stop_ids=())
    assert res.token_ids == hf_greedy(ref, prompt, NEW) and res.speculative["steps"] > 0

    cpu_model, _ = load_model(path)
    want_mtp = MTPLayer.from_model(cpu_model)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, engine.config.hidden, generator=g)
    nxt = torch.randint(0, VOCAB, (5,), generator=g)
    got = engine.mtp_layer(hidden.to(DEV), nxt.to(DEV), engine.mtp_layer.new_state())
    want = want_mtp(hidden, nxt, want_mtp.new_state())
    assert (got.cpu() - want).abs().max().item() < TOL * max(1.0, want.abs().max().item())
