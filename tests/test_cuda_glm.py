"""The CUDA path of GLM-4.7-Flash (`glm4_moe_lite`) and GLM-5 (`glm_moe_dsa`): engine/gpu/glm.py
and its kernels (kernels/moe, kernels/mla_decode), against HF transformers 5.24 on tiny random
checkpoints (fp32) and the kernels against their PyTorch references.

Without a GPU the same code runs on CPU tensors under TRITON_INTERPRET=1 (`kernels="triton"`);
the tests skip cleanly where neither is available."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_glm import VOCAB, make_tiny_glm, write_glm_tokenizer  # noqa: E402

pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")]
DEV = "cuda" if has_cuda() else "cpu"
TOL = 1e-4  # as tests/test_glm.py (fp32)


@pytest.fixture(autouse=True)
def _few_configs(few_gemv_configs, monkeypatch):
    """On the GPU, correctness only: two configs per autotuned kernel, not every one compiled."""
    if not has_triton() or interpreting():
        return
    from docqa.kernels.moe import triton_moe

    for kernel in (triton_moe._moe_gate_up_kernel, triton_moe._moe_down_kernel):
        monkeypatch.setattr(kernel, "configs", kernel.configs[:2])


def glm_engine(path):
    from docqa.engine import Engine

    write_glm_tokenizer(path)
    return Engine.load(path, device=DEV, kernels="triton", dtype=torch.float32)


def close(got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    diff = (got.float().cpu() - want.float().cpu()).abs().max().item()
    assert diff < tol, diff


# --- kernels against their references -----------------------------------------------------------

def test_moe_gemvs_match_reference():
    from docqa.kernels.moe import fused_moe_down, fused_moe_gate_up, naive_moe_down, naive_moe_gate_up

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 72, generator=g).to(DEV)
    w13 = torch.randn(7, 2 * 40, 72, generator=g).to(DEV)
    w2 = torch.randn(7, 72, 40, generator=g).to(DEV)
    ids = torch.tensor([6, 2, 4, 0], device=DEV)  # out of order, the last one as a shared expert would be
    wts = torch.rand(4, generator=g).to(DEV)
    act = fused_moe_gate_up(x, w13, ids)
    close(act, naive_moe_gate_up(x, w13, ids))
    res = torch.randn(1, 72, generator=g).to(DEV)
    close(fused_moe_down(act, w2, ids, wts, res), naive_moe_down(act, w2, ids, wts, res), 1e-3)
    # by hand for one expert: the kernel reads expert 6's rows, not a neighbour's
    gate, up = (w13[6] @ x[0]).chunk(2)
    close(act[0], torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("length", [1, 45, 150])
def test_mla_decode_matches_reference(length):
    from docqa.kernels.mla_decode import fused_mla_decode, naive_mla_decode

    g = torch.Generator().manual_seed(length)
    h, r, p, cap = 20, 32, 16, 160
    q = torch.randn(1, h, r + p, generator=g).to(DEV)
    kv = torch.randn(cap, r + p, generator=g).to(DEV)
    n = torch.tensor([length], dtype=torch.int32, device=DEV)
    want = naive_mla_decode(q, kv, n, r, 0.1)
    close(fused_mla_decode(q, kv, n, r, 0.1), want, 1e-5)
    close(fused_mla_decode(q, kv, n, r, 0.1, splits=3), want, 1e-5)  # the split merge (empty splits too)
    # and against plain softmax attention over the first `length` latents
    s = (q[0] @ kv[:length].t()) * 0.1
    close(want[0], torch.softmax(s, -1) @ kv[:length, :r], 1e-5)
    idx = torch.tensor([[length - 1, -1, 0] + list(range(2, min(length, 40)))], device=DEV)
    close(fused_mla_decode(q, kv, n, r, 0.1, indices=idx), naive_mla_decode(q, kv, n, r, 0.1, indices=idx), 1e-5)


def test_mla_token_lists_match_the_sparse_reference():
    """Many query rows, each over its own token list (DSA prefill), against kernels/mla_sparse's
    reference: the same attention written independently."""
    from docqa.kernels.mla_decode import fused_mla_decode
    from docqa.kernels.mla_sparse import naive_mla_sparse_attention

    g = torch.Generator().manual_seed(7)
    t, h, r, p, s, k = 5, 20, 32, 16, 90, 24
    q = torch.randn(t, h, r + p, generator=g).to(DEV)
    kv = torch.randn(s, r + p, generator=g).to(DEV)
    idx = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(t)])
    idx[1, 5:] = -1  # a row with fewer tokens than k
    idx = idx.to(DEV)
    close(fused_mla_decode(q, kv, None, r, 0.1, idx), naive_mla_sparse_attention(q, kv, idx, r, 0.1), 1e-5)


# --- the decoder against HF transformers ----------------------------------------------------------

def hf_logits(ref, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref(ids[None]).logits[0]


def decode_logits(engine, state, tokens: list[int]) -> torch.Tensor:
    """Teacher-forced decode steps through the graphed step (eager off CUDA): each step's logits."""
    g = engine.model.capture_decode(state)
    g.reset(state.num_tokens, tokens[0])
    out = []
    for t in tokens:
        g.tok.fill_(t)
        g.step()
        out.append(g.logits[0].float().clone())
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["glm4_moe_lite", "glm_moe_dsa"])
def test_cuda_glm_matches_hf(tmp_path, kind):
    """Prefill in chunks (the later ones after a stored prefix; for GLM-5 the indexer's top-k of
    24 is well below the 60-token context) and graphed decode steps give HF's logits."""
    ref = make_tiny_glm(tmp_path, kind)
    engine = glm_engine(tmp_path)
    assert engine.triton and type(engine.model).__name__ == "GlmCudaDecoder"
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(1))
    want = hf_logits(ref, ids)
    state = engine.new_state(capacity=8)  # grows as prefill needs
    got = engine.model.prefill(ids[:56].to(DEV), state, 0, chunk=24, all_logits=True)
    state.commit(56)
    close(got, want[:56])
    close(decode_logits(engine, state, ids[56:60].tolist()), want[56:60])


@pytest.mark.slow  # ~2 min under the interpreter; the logits tests above cover the same path
def test_cuda_glm5_greedy_generation_equals_hf(tmp_path):
    """Engine.generate on the CUDA path (prefill, then the graph-captured greedy loop) produces
    transformers' greedy tokens."""
    ref = make_tiny_glm(tmp_path, "glm_moe_dsa")
    engine = glm_engine(tmp_path)
    ids = torch.randint(2, VOCAB, (32,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref.generate(ids[None], max_new_tokens=4, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, 32:].tolist()
    res = engine.generate(ids.tolist(), 4, stop_ids=())
    assert res.token_ids == want


def test_dense_mla_baseline_is_exact_attention(tmp_path):
    """The benchmark's dense-MLA baseline on a GLM-5 checkpoint (dsa=False) is the same model
    with every token kept (the CPU model with a top-k above the context), and differs from the
    DSA logits: the indexer's choices matter at this context."""
    import dataclasses

    from docqa.engine.checkpoint import load_model
    from docqa.engine.mla_state import MLAKVState

    ref = make_tiny_glm(tmp_path, "glm_moe_dsa")
    engine = glm_engine(tmp_path)
    ids = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(4))
    dense = engine.model.prefill(ids.to(DEV), engine.model.new_state(64, dsa=False), 0, chunk=40, all_logits=True)
    cpu, ckpt = load_model(tmp_path)
    cfg = dataclasses.replace(ckpt.config, dsa=dataclasses.replace(ckpt.config.dsa, topk=10_000))
    close(dense, cpu(ids, MLAKVState(cfg, cpu.rope)))
    assert (dense.cpu() - hf_logits(ref, ids)).abs().max().item() > 100 * TOL
