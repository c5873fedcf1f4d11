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

from test_glm import VOCAB, make_tiny_glm, tiny_config, write_glm_tokenizer  # noqa: E402

slow_on_cpu = (lambda test: test) if has_cuda() else pytest.mark.slow

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("few_moe_configs"),
              pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")]
DEV = "cuda" if has_cuda() else "cpu"
TOL = 1e-4  # as tests/test_glm.py (fp32)


def glm_engine(path, dtype=torch.float32):
    from docqa.engine import Engine

    write_glm_tokenizer(path)
    return Engine.load(path, device=DEV, kernels="triton", dtype=dtype)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_prefill_matches_per_token_reference(dtype):
    """The grouped prefill MoE (tokens sorted by expert, one grouped GEMM per projection; on CUDA
    bf16 torch._grouped_mm, fp32 a GEMM per expert) against each token's experts run one by one
    through the decode references, with experts nobody picked and one picked by every token."""
    from docqa.kernels.moe import naive_moe_down, naive_moe_gate_up
    from docqa.kernels.moe.grouped import moe_prefill

    g = torch.Generator().manual_seed(5)
    t, h, i, e, k = 37, 64, 48, 9, 3
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.2
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    ids = torch.stack([torch.randperm(e - 3, generator=g)[:k] for _ in range(t)])  # experts 6, 7 idle
    ids = torch.cat((ids, torch.full((t, 1), e - 1)), dim=1)  # expert 8: every token (a shared one)
    wts = torch.rand(t, k + 1, generator=g)
    res = torch.randn(t, h, generator=g)
    want = torch.cat([naive_moe_down(naive_moe_gate_up(x[j:j + 1], w13, ids[j]), w2, ids[j], wts[j], res[j:j + 1])
                      for j in range(t)])
    dev = [a.to(DEV, dtype) for a in (x, w13, w2, res)]
    got = moe_prefill(dev[0], dev[1], dev[2], ids.to(DEV), wts.to(DEV), dev[3])
    assert got.data_ptr() == dev[3].data_ptr()  # in place on the residual stream
    scale = want.abs().max().item()
    close(got, want, (1e-4 if dtype == torch.float32 else 2e-2) * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_combine_kernel_matches_reference(dtype):
    """The Triton combine (each token's K expert outputs, found through the inverse of the
    expert sort, weighted and added to its residual row) against the sum written out in fp64,
    at a width that is not a multiple of its column block."""
    from docqa.kernels.moe.triton_combine import fused_moe_combine

    g = torch.Generator().manual_seed(8)
    t, k, h = 23, 5, 1100
    ys = torch.randn(t * k, h, generator=g)
    inv = torch.randperm(t * k, generator=g)
    wts = torch.rand(t, k, generator=g)
    res = torch.randn(t, h, generator=g)
    want = res.double() + (wts.double()[:, :, None] * ys.double()[inv].view(t, k, h)).sum(1)
    dev = [a.to(DEV, dtype) for a in (ys, res)]
    got = fused_moe_combine(dev[0], inv.to(DEV), wts.to(DEV), dev[1])
    assert got.data_ptr() == dev[1].data_ptr()
    close(got.double(), want, (1e-5 if dtype == torch.float32 else 1e-2) * want.abs().max().item())


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


def decode_logits(engine, state, tokens: list[int], *, graph: bool = True) -> torch.Tensor:
    """Teacher-forced decode steps through the graphed step (eager off CUDA, or with graph=False):
    each step's logits."""
    from docqa.engine.gpu.model import GraphedDecode

    g = engine.model.capture_decode(state) if graph else GraphedDecode(engine.model, state, state.num_tokens,
                                                                        graph=False)
    g.reset(state.num_tokens, tokens[0])
    out = []
    for t in tokens:
        g.tok.fill_(t)
        g.step()
        out.append(g.logits[0].float().clone())
    return torch.stack(out)


# GLM-5 (DSA) costs ~60 s under the interpreter: -m slow on the CPU, by default on a GPU
@pytest.mark.parametrize("kind", ["glm4_moe_lite",
                                  pytest.param("glm_moe_dsa", marks=[] if has_cuda() else [pytest.mark.slow])])
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
    """The benchmark's dense-MLA baseline on a GLM-5 checkpoint (bench/gpu_glm.py
    `dense_mla_state`: the state of the config without its indexer) is the same model with every
    token kept (the CPU model with a top-k above the context), and differs from the DSA logits:
    the indexer's choices matter at this context."""
    import dataclasses

    from docqa.bench.gpu_glm import dense_mla_state
    from docqa.engine.checkpoint import load_model
    from docqa.engine.mla_state import MLAKVState

    ref = make_tiny_glm(tmp_path, "glm_moe_dsa")
    engine = glm_engine(tmp_path)
    ids = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(4))
    dense = engine.model.prefill(ids.to(DEV), dense_mla_state(engine, 64, 40), 0, chunk=40, all_logits=True)
    cpu, ckpt = load_model(tmp_path)
    cfg = dataclasses.replace(ckpt.config, dsa=dataclasses.replace(ckpt.config.dsa, topk=10_000))
    close(dense, cpu(ids, MLAKVState(cfg, cpu.rope)))
    assert (dense.cpu() - hf_logits(ref, ids)).abs().max().item() > 100 * TOL


# --- GLM-4.7-Flash under the engine's sparse settings: routed attention on the latent ----------

def routed_settings(engine, **over):
    """Sparse settings scaled to a 60-token context: blocks of 8, a window of 8, 2 sinks, routing
    chunks of 8 queries with the last 3 on their own; prefill chunks of 24."""
    return engine.sparse_settings(**{**dict(block_size=8, window=8, sink_tokens=2, route_chunk=8, route_tail=3,
                                            chunk_size=24, top_k=64), **over})


def force_expanded(monkeypatch, expand: bool) -> None:
    """Routed prefill on the absorbed kernel (False) or on expanded keys and values (True), which
    the decoder picks per call by cost (a tiny model's calls would all stay absorbed)."""
    from docqa.engine.gpu.glm import GlmCudaDecoder

    monkeypatch.setattr(GlmCudaDecoder, "_expands", lambda self, *args: expand)


# ~40 s under the interpreter: -m slow on the CPU (test_cuda_glm_matches_hf holds the decoder to
# HF there and the small-budget test below the routing to its references), by default on a GPU
@slow_on_cpu
def test_cuda_glm_routed_with_the_whole_context_in_budget_matches_hf(tmp_path, monkeypatch):
    """With top_k above the number of blocks every candidate is read: sinks + blocks + window is
    the whole causal context, so chunked prefill (in either form of the attention: on the
    latent, and on keys and values expanded per head) and graphed decode give HF's (dense)
    logits."""
    ref = make_tiny_glm(tmp_path, "glm4_moe_lite")
    engine = glm_engine(tmp_path)
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(8))
    want = hf_logits(ref, ids)
    for expand in (False, True):
        force_expanded(monkeypatch, expand)
        state = engine.new_state(8, routed_settings(engine))
        assert state.routed
        got = engine.model.prefill(ids[:56].to(DEV), state, 0, all_logits=True)
        state.commit(56)
        close(got, want[:56])
    close(decode_logits(engine, state, ids[56:60].tolist()), want[56:60])


@(pytest.mark.slow if not has_cuda() else lambda test: test)  # ~140 s under the interpreter
def test_cuda_glm_routed_with_more_blocks_than_the_fused_top_k_takes_matches_hf(tmp_path):
    """The whole context in budget past 64 blocks (blocks of 2, 150 tokens): routing takes
    torch.topk instead of the fused top-k (which stops at 64), the budget (1 << 20) far above the
    block count; the second prefill call starts mid-block and off a chunk boundary, as the
    bench's check at the real shape does (8,128 tokens, then 64 with all logits)."""
    ref = make_tiny_glm(tmp_path, "glm4_moe_lite")
    engine = glm_engine(tmp_path)
    ids = torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(12))
    want = hf_logits(ref, ids)
    state = engine.new_state(8, routed_settings(engine, block_size=2, route_chunk=16, chunk_size=64, top_k=1 << 20))
    first = engine.model.prefill(ids[:135].to(DEV), state, 0, all_logits=True)
    state.commit(135)
    close(first, want[:135])
    close(engine.model.prefill(ids[135:].to(DEV), state, 135, all_logits=True), want[135:])


@(pytest.mark.slow if not has_cuda() else lambda test: test)  # ~4-6 min under the interpreter
def test_cuda_glm_routed_whole_budget_is_dense_mla_at_the_real_attention_dims(tmp_path):
    """GLM-4.7-Flash's attention dims (20 heads, kv_lora_rank 512, rope 64, nope 192, v 256) in
    two layers (the second MoE) of a narrow model, as bench/gpu_glm.py's check: the last 64
    logits of a context prefilled in two calls, routed with every block in budget against dense
    MLA (`attention="dense"`: SDPA over expanded keys and values) of the same engine. On a GPU
    in bf16 with the engine's sparse settings (blocks of 64, window 1,024, chunks of 4,096:
    4,200 tokens: past the fused top-k's 64 blocks, the second call mid-block and off a chunk
    boundary); under the interpreter fp32 at a scaled-down context."""
    from docqa.engine import Engine

    torch.manual_seed(0)
    cfg = tiny_config("glm4_moe_lite", num_hidden_layers=2, num_attention_heads=20, num_key_value_heads=20,
                      kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=192, v_head_dim=256, q_lora_rank=64,
                      first_k_dense_replace=1)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(tmp_path)
    write_glm_tokenizer(tmp_path)
    gpu = has_cuda()
    engine = Engine.load(tmp_path, device=DEV, kernels="triton", dtype=torch.bfloat16 if gpu else torch.float32)
    n, over = (4200, {}) if gpu else (603, dict(block_size=8, window=32, chunk_size=256, route_chunk=64))
    ids = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(13)).to(DEV)

    def logits(settings):
        state = engine.new_state(n, settings)
        engine.model.prefill(ids[:-64], state, 0)
        state.commit(n - 64)
        return engine.model.prefill(ids[-64:], state, n - 64, all_logits=True).float().cpu()

    dense = logits(engine.sparse_settings(attention="dense", **over))
    routed = logits(engine.sparse_settings(top_k=1 << 20, **over))
    cos = torch.nn.functional.cosine_similarity(routed.flatten(), dense.flatten(), dim=0).item()
    assert cos > (0.9995 if gpu else 0.999999), cos  # bf16: 1 - cos was 2e-5 on one layer (CPU)
    close(routed, dense, 0.1 * dense.std().item() if gpu else 1e-5)


# the expanded form's variant (~30 s under the interpreter) repeats the routing; its kernel is
# checked against the same reference in test_kernel_mla_sparse.py
@pytest.mark.parametrize("expand", [False, pytest.param(True, marks=[] if has_cuda() else [pytest.mark.slow])],
                         ids=["absorbed", "expanded"])
def test_cuda_glm_routed_small_budget_matches_reference_of_the_same_selection(tmp_path, monkeypatch, expand):
    """One routed block per routing chunk (far below the context): the logits leave HF's, and
    equal the same decoder with block scoring and attention done by the PyTorch references
    (kernels/mla_sparse naive_*), so the kernels route and attend as the references would."""
    from docqa.engine.gpu import glm
    from docqa.kernels.mla_sparse import (
        naive_mla_block_scores,
        naive_mla_routed_attention,
        naive_mla_routed_attention_expanded,
    )

    ref = make_tiny_glm(tmp_path, "glm4_moe_lite")
    engine = glm_engine(tmp_path)
    force_expanded(monkeypatch, expand)
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(9))
    settings = routed_settings(engine, top_k=1)

    def run(graph):
        state = engine.new_state(8, settings)
        out = engine.model.prefill(ids[:56].to(DEV), state, 0, all_logits=True)
        state.commit(56)
        return torch.cat((out.cpu(), decode_logits(engine, state, ids[56:58].tolist(), graph=graph).cpu()))

    got = run(graph=True)
    assert (got - hf_logits(ref, ids)[:58]).abs().max().item() > 100 * TOL

    def scores(q, kmin, kmax, kmean, method, chunk, q0, first, window, b, *, end=None):
        if end is not None:  # decode: a position whose window starts the candidates' end there
            q0 = int(end) * b + window - b
        return naive_mla_block_scores(q, kmin, kmax, kmean, method, chunk, q0, first, window, b).to(q.device)

    def attention(q, lat, q0, blocks, chunk, b, sinks, window, r, scale):
        return naive_mla_routed_attention(q, lat, q0, blocks, chunk, b, sinks, window, r, scale)

    def expanded(q_nope, q_rot, lat, w_kv, q0, blocks, chunk, b, sinks, window, scale, out):
        out.copy_(naive_mla_routed_attention_expanded(q_nope, q_rot, lat, w_kv, q0, blocks, chunk, b, sinks, window,
                                                      scale))
        return out

    def decode(q, lat, length, r, scale, indices=None, *, routed):
        blocks, sinks, window, b = routed
        return naive_mla_routed_attention(q, lat, int(length) - 1, blocks, 1, b, sinks, window, r, scale)

    monkeypatch.setattr(glm, "fused_mla_block_scores", scores)
    monkeypatch.setattr(glm, "fused_mla_routed_attention", attention)
    monkeypatch.setattr(glm, "fused_mla_routed_attention_expanded", expanded)
    monkeypatch.setattr(glm, "fused_mla_decode", decode)
    # the references read host values (int(end), int(length)): their decode runs eagerly, not
    # captured as a CUDA graph (the kernels' run above is graphed on a GPU)
    close(got, run(graph=False))


# GLM-5's variant (indexer keys in the files too) takes ~75 s under the interpreter
@pytest.mark.parametrize("kind", ["glm4_moe_lite", pytest.param("glm_moe_dsa", marks=pytest.mark.slow)])
def test_cuda_glm_prefix_cache_segments_from_files_equal_a_fresh_prefill(tmp_path, kind):
    """A document's segments saved by one prefix cache (latents, indexer keys, block descriptors)
    and adopted from their files by another (a new process: nothing live) continue exactly as a
    fresh prefill of the whole prompt: the same state rows and the same logits, prefill and
    decode."""
    from docqa.engine.prefix_cache import PrefixCache

    make_tiny_glm(tmp_path / "m", kind)
    engine = glm_engine(tmp_path / "m")
    settings = routed_settings(engine, top_k=1, segment_size=16)
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(10)).tolist()

    first = PrefixCache.for_engine(engine, settings, cache_dir=tmp_path / "kv")
    state, cached = first.get_state("doc", ids[:50])
    assert cached == 0
    engine.prefill(ids[:50], state)
    assert first.save("doc", ids[:50], state) == 3  # three full segments of 16
    first.flush()

    second = PrefixCache.for_engine(engine, settings, cache_dir=tmp_path / "kv")
    state, cached = second.get_state("doc", ids[:56])
    assert cached == 48 and second.hits_disk == 3 and second.hits_live == 0
    got = engine.prefill(ids[48:56], state, all_logits=True)
    fresh = engine.new_state(64, settings)
    want = engine.prefill(ids[:56], fresh, all_logits=True)[48:]
    close(got, want, 1e-5)
    held = ["kv", "ik"] if kind == "glm_moe_dsa" else ["kv", "kmin", "kmax", "kmean"]
    for name in held:
        a, b = getattr(state, name), getattr(fresh, name)
        n = 56 if name in ("kv", "ik") else 7  # rows, blocks of 8
        assert a.shape[0] and a.shape[2]
        close(a[:, :n], b[:, :n], 1e-5)
    close(decode_logits(engine, state, ids[56:57]), decode_logits(engine, fresh, ids[56:57]), 1e-5)  # a step on it


# --- FP8 checkpoints: e4m3 weights with block scales kept 1-byte on the device -----------------

FP8_BLOCK = (32, 32)  # off the tiny model's row counts (48-row q_a / kv_a): partial blocks, fused across


def write_fp8_glm(path, kind: str, *, block: tuple[int, int] = FP8_BLOCK, make=make_tiny_glm):
    """A tiny checkpoint in the official FP8 layout (each linear layer's matrix e4m3 with
    `weight_scale_inv` per 32 x 32 block; experts one matrix each, as the GLM-5 FP8 release;
    norms, gate, embeddings, head and the indexer's weights_proj (bf16 in DeepSeek-V3.2) left as
    they are) and HF's model running the dequantised values: the reference. `make(path, kind)`
    writes the unquantised checkpoint (tests/test_cuda_fp8.py: the Llama family's too)."""
    import json

    from safetensors.torch import save_file
    from test_kernel_fp8 import quantize_blocks

    from docqa.engine.models.fp8 import dequantize_blocks

    ref = make(path / "bf", kind)

    def quantized(w):
        w8, scale = quantize_blocks(w.float(), block)
        return w8, scale, dequantize_blocks(w8, scale, block)

    tensors = {}
    with torch.no_grad():
        for name, p in ref.state_dict().items():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                base = name.removesuffix("gate_up_proj").removesuffix("down_proj")
                for j in range(p.shape[0]):
                    halves = p[j].chunk(2) if name.endswith("gate_up_proj") else (p[j],)
                    kinds = ("gate", "up") if name.endswith("gate_up_proj") else ("down",)
                    deq = []
                    for kind_, w in zip(kinds, halves):
                        w8, scale, d = quantized(w)
                        tensors[f"{base}{j}.{kind_}_proj.weight"] = w8
                        tensors[f"{base}{j}.{kind_}_proj.weight_scale_inv"] = scale
                        deq.append(d)
                    p[j].copy_(torch.cat(deq))
            elif name.endswith("proj.weight") and "weights_proj" not in name and p.dim() == 2:
                w8, scale, d = quantized(p)
                tensors[name], tensors[name + "_scale_inv"] = w8, scale
                p.copy_(d)
            else:
                tensors[name] = p.contiguous()
    out = path / "fp8"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((path / "bf" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(cfg))
    ref.save_pretrained(path / "deq")  # the dequantised weights as a plain checkpoint
    return ref, out


# ~70 s (GLM-4.7-Flash) and ~140 s (GLM-5) under the interpreter: -m slow on the CPU, by default on a GPU;
# tests/test_kernel_fp8.py checks the kernels on the CPU by default
@pytest.mark.parametrize("kind", [pytest.param(k, marks=[] if has_cuda() else [pytest.mark.slow])
                                  for k in ("glm4_moe_lite", "glm_moe_dsa")])
def test_cuda_glm_fp8_checkpoint_matches_hf_on_dequantised_weights(tmp_path, kind):
    """An FP8 checkpoint through Engine.load on the CUDA path: its matrices stay e4m3 (no
    expanded copy) and chunked prefill and graphed decode give HF's logits on the dequantised
    weights (fp32 activations: the FP8 kernels' exact mode)."""
    from docqa.kernels.linear.naive_fp8 import FP8, Fp8Weight

    ref, path = write_fp8_glm(tmp_path, kind)
    engine = glm_engine(path)
    model = engine.model
    assert type(model).__name__ == "GlmCudaDecoder" and model.config.fp8_block == FP8_BLOCK
    moe = model.layers[1].moe  # engine/gpu/moe.py `MoeLayer`
    for w in (model.layers[1].wb, model.layers[1].wo, moe.w13, moe.w2, model.layers[0].w13, model.layers[0].w2):
        assert isinstance(w, Fp8Weight) and w.w.dtype == FP8
    assert moe.w13.w.shape[0] == 9  # 8 routed experts and the shared one, all FP8
    if kind == "glm_moe_dsa":  # the bf16 indexer weights_proj runs beside the FP8 part of the projection
        assert isinstance(model.layers[0].wa, list) and isinstance(model.layers[0].wa[0], Fp8Weight)
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(11))
    want = hf_logits(ref, ids)
    state = engine.new_state(capacity=8)
    got = model.prefill(ids[:56].to(DEV), state, 0, chunk=24, all_logits=True)
    state.commit(56)
    close(got, want[:56])
    close(decode_logits(engine, state, ids[56:60].tolist()), want[56:60])


@pytest.mark.skipif(not has_cuda(), reason="bf16 FP8 dots: the interpreter rounds fp32 -> e4m3 wrongly on carries")
def test_cuda_glm_fp8_bf16_matches_dequantised_bf16_engine(tmp_path):
    """In bf16 (prefill quantises activations per token and 32 columns to e4m3 for the FP8 dot;
    decode reads the e4m3 weights in GEMVs) against the bf16 engine on the dequantised
    checkpoint: logits within bf16 + e4m3 activation error, the same greedy tokens mostly, and
    about half the weight bytes of the matrices."""
    from docqa.kernels.gpu import interpreting

    assert not interpreting()
    ref, path = write_fp8_glm(tmp_path, "glm4_moe_lite")
    fp8 = glm_engine(path, torch.bfloat16)
    bf16 = glm_engine(tmp_path / "deq", torch.bfloat16)
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(12))
    outs = []
    for engine in (fp8, bf16):
        state = engine.new_state(capacity=64)
        logits = engine.model.prefill(ids[:56].to(DEV), state, 0, chunk=24, all_logits=True)
        state.commit(56)
        outs.append(torch.cat((logits.float().cpu(), decode_logits(engine, state, ids[56:60].tolist()).cpu())))
    # e4m3 activations carry ~2^-5 relative error per element into every prefill product (and so
    # into the cached latents decode reads); a wrong scale or block would be off by O(1)
    err = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert err < 0.1, err
    assert fp8.model.nbytes() < 0.8 * bf16.model.nbytes()
