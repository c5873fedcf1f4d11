"""GLM-4 (`glm4`, dense) and GLM-4.5/4.6 (`glm4_moe`) on the engine's Triton decoder
(engine/gpu/model.py `CudaDecoder`): the Llama family's states, routing and prefix cache with
GLM's partial / interleaved RoPE, q/k biases and norms, sandwich norms and MoE — against HF
transformers 5.24 on tiny random checkpoints (fp32) and the PyTorch sparse state.

Without a GPU the same code runs on CPU tensors under TRITON_INTERPRET=1 (`kernels="triton"`);
the costlier interpreter runs are -m slow on the CPU and run by default on a GPU."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_glm import VOCAB, make_tiny_glm, tiny_config, write_glm_tokenizer  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("few_moe_configs")]
triton_runs = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if has_cuda() else "cpu"
TOL = 1e-3 if has_cuda() else 1e-4  # as tests/test_cuda_engine.py: Triton's fp32 dots run in TF32 on the GPU
# Default CPU run ~50 s under the interpreter (each decode GEMV is tens of programs at BLOCK_N=4):
# glm4 on the dense state and glm4_moe on the sparse one; the rest is -m slow on the CPU and
# runs by default on a GPU.
slow_on_cpu = (lambda test: test) if has_cuda() else pytest.mark.slow
SLOW_ON_CPU = [] if has_cuda() else [pytest.mark.slow]


# GLM-4.5 with q/k/v biases on top of its q/k norms (transformers' default has none), so the
# decode epilogue launch does both; "glm4_moe-plain" has neither (GLM-4.5's defaults), so RoPE
# and the KV append ride in the qkv GEMV's epilogue as Llama's do
GLM4_MOE = {"glm4_moe": dict(attention_bias=True), "glm4_moe-plain": dict(attention_bias=False, use_qk_norm=False)}


def tiny_glm(path, kind: str):
    """HF's model and our Triton engine over the same random checkpoint."""
    ref = make_tiny_glm(path, "glm4_moe", **GLM4_MOE[kind]) if kind in GLM4_MOE else make_tiny_glm(path, kind)
    write_glm_tokenizer(path)
    from docqa.engine import Engine

    engine = Engine.load(path, device=DEV, kernels="triton", dtype=torch.float32)
    assert engine.triton and type(engine.model).__name__ == "CudaDecoder"
    assert engine.model.fold_qkv == (kind == "glm4_moe-plain")
    return ref, engine


def ids_of(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    diff = (got.float().cpu() - want.float().cpu()).abs().max().item()
    assert diff < TOL, (what, diff)


# --- RoPE ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["glm4", "glm4_moe"])
def test_reordered_head_dims_make_glm_rope_rotate_half(kind):
    """The decoder loads q/k dims in `rope_halves_order` and turns them with rotate_half over the
    whole head at angles padded with zeros: the result is the CPU path's partial (interleaved
    for glm4) RoPE (engine/rope.py, checked against HF in tests/test_glm.py), reordered."""
    from docqa.engine.config import ModelConfig
    from docqa.engine.gpu.model import rope_halves_order
    from docqa.engine.rope import Rope, inv_frequencies
    from docqa.kernels.rope import naive_rope

    config = ModelConfig.from_hf(tiny_config(kind).to_dict())
    assert config.rotary_dim == config.head_dim // 2 and config.rope_interleaved == (kind == "glm4")
    order = rope_halves_order(config)
    assert sorted(order) == list(range(config.head_dim)) and order != list(range(config.head_dim))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, config.head_dim, generator=g, dtype=torch.float64).float()
    pos = torch.tensor([0, 1, 7, 300, 4095])
    want = Rope(config).apply(x, pos)[..., order]
    inv = inv_frequencies(config).double()
    inv = torch.cat([inv, inv.new_zeros(config.head_dim // 2 - inv.numel())])
    ang = pos.double()[:, None] * inv
    got = naive_rope(x[..., order].contiguous(), ang.cos().float(), ang.sin().float())
    assert (got - want).abs().max() < 3e-4  # engine/rope.py's fp32 angles at position 4095; ours are fp64
    # the dims RoPE leaves alone come through untouched
    rest = [j for j, d in enumerate(order) if d >= config.rotary_dim]
    assert torch.equal(got[..., rest], x[..., order][..., rest])


# --- the decoder against HF transformers --------------------------------------------------------------

@triton_runs
@pytest.mark.parametrize("kind", ["glm4", pytest.param("glm4_moe", marks=SLOW_ON_CPU)])  # glm4_moe: ~50 s on the CPU
def test_triton_glm_matches_hf_dense_state(tmp_path, kind):
    """Dense state (what `ask` uses): every prompt position's logits (two prefill calls: the
    second after a stored prefix), then three decode steps against HF on the growing sequence
    (the CUDA graph on a GPU, where greedy through the device loop must equal argmax choosing)."""
    ref, engine = tiny_glm(tmp_path, kind)
    ids = ids_of(24)
    prefill_then_decode_match_hf(engine, ref, ids, close)
    if has_cuda():  # greedy through the device-side loop (the CUDA graph) gives the argmax chooser's tokens
        argmax = engine.generate(ids, 3, stop_ids=(), choose=lambda logits, out: int(logits.argmax())).token_ids
        assert engine.generate(ids, 3, stop_ids=()).token_ids == argmax


def prefill_then_decode_match_hf(engine, ref, ids: list[int], close) -> None:
    """The dense state's logits against HF's (`ref`) on `ids`: a prefill in two calls (the second
    after a stored prefix), then three decode steps from the last prompt token, the second-best
    token taken once (where the device loop's greedy guess is wrong), each step against HF on the
    growing sequence. `close(got, want, what)` is the caller's tolerance."""
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    state = engine.new_state(32)
    got = torch.cat([engine.prefill(ids[:13], state, all_logits=True),
                     engine.prefill(ids[13:-1], state, all_logits=True)])
    close(got, want[:-1], "prefill")
    seen = []

    def choose(logits, out):
        seen.append(logits.cpu().clone())
        return int(logits.argsort(descending=True)[1 if len(out) == 1 else 0])

    res = engine.generate(ids[-1:], 3, state=state, stop_ids=(), choose=choose)
    with torch.no_grad():
        full = ref(torch.tensor([ids + res.token_ids])).logits[0]
    assert len(seen) == 3
    for i, logits in enumerate(seen):
        close(logits, full[len(ids) - 1 + i], f"step {i}")


def sparse(engine, **over):
    s = dict(window=32, block_size=16, top_k=2, sink_tokens=4, chunk_size=64, route_chunk=32, route_tail=8,
             segment_size=32, kv_dtype="float32", dense_below=0)
    return engine.sparse_settings(**(s | over))


@triton_runs
@pytest.mark.parametrize("kind", [pytest.param("glm4", marks=SLOW_ON_CPU), "glm4_moe",  # ~25 s each on the CPU
                                  pytest.param("glm4_moe-plain", marks=SLOW_ON_CPU)])
def test_triton_glm_sparse_state_with_everything_in_budget_matches_hf(tmp_path, kind):
    """The routed sparse state (sinks + top-k blocks + window, what `--read-all` runs) over a
    context its budget covers: routing runs (queries past the window pick blocks by the
    descriptors of the reordered keys) and must pick every block, so logits are HF's exactly,
    prefill in routing chunks and decode steps alike."""
    ref, engine = tiny_glm(tmp_path, kind)
    s = sparse(engine)
    ids = ids_of(50, 2)
    assert len(ids) + 4 <= s.budget and len(ids) > s.window + s.block_size
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    state = engine.new_state(64, s)
    assert type(state).__name__ == "CudaKVState" and state.settings.attention == "sparse"
    close(engine.prefill(ids, state, all_logits=True), want, "prefill")
    seen = []
    res = engine.generate(ids_of(2, 3), 3, state=state, stop_ids=(),
                          choose=lambda logits, out: seen.append(logits.cpu().clone()) or int(logits.argmax()))
    seq = ids + ids_of(2, 3) + res.token_ids
    with torch.no_grad():
        full = ref(torch.tensor([seq])).logits[0]
    for i, logits in enumerate(seen):
        close(logits, full[len(ids) + 1 + i], f"decode step {i}")


@triton_runs
@slow_on_cpu  # ~60 s under the interpreter
def test_triton_glm4_past_the_budget_matches_the_pytorch_sparse_state(tmp_path):
    """A context past the routing budget, so blocks are really chosen: the Triton decoder's
    sparse state (reordered q/k dims) against the PyTorch sparse state of the CPU model (HF's
    dim order) — the same blocks, so the same logits and greedy tokens."""
    from docqa.engine import Engine

    _, tri = tiny_glm(tmp_path, "glm4")
    cpu = Engine.load(tmp_path, device="cpu", decode_weights="fp32")
    s = sparse(tri, chunk_size=64)
    ids = ids_of(112)
    assert len(ids) > s.budget
    cpu.prefill_chunk = s.chunk_size
    a = tri.prefill(ids, s_tri := tri.new_state(128, s), all_logits=True)
    b = cpu.prefill(ids, s_cpu := cpu.new_state(128, s), all_logits=True)
    close(a, b, "prefill")
    assert type(s_cpu).__name__ == "SparseKVState"
    q = ids_of(3, 9)
    assert tri.generate(q, 3, state=s_tri, stop_ids=()).token_ids == cpu.generate(q, 3, state=s_cpu, stop_ids=()).token_ids


@triton_runs
@slow_on_cpu  # ~60 s under the interpreter
def test_prefix_cache_round_trip_on_glm4(tmp_path):
    """A document's segments saved from one state and adopted from disk by another process's
    cache: continuing from them answers exactly as a fresh full prefill does (the segments hold
    the reordered, rotated keys this decoder reads)."""
    from docqa.engine.prefix_cache import PrefixCache

    _, eng = tiny_glm(tmp_path / "m", "glm4")
    s = sparse(eng)
    doc, q = ids_of(80, 3), ids_of(5, 4)
    fresh = eng.generate(doc + q, 4, state=eng.new_state(128, s), stop_ids=()).token_ids
    cache = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    state = eng.new_state(128, s)
    eng.prefill(doc, state)
    cache.save("doc", doc, state)
    cache.flush()
    other = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    state, cached = other.get_state("doc", doc, capacity=128)
    assert cached == 64 and other.hits_disk == 2
    eng.prefill(doc[cached:], state)
    assert eng.generate(q, 4, state=state, stop_ids=()).token_ids == fresh


@triton_runs
@slow_on_cpu  # ~90 s under the interpreter
def test_tiered_state_on_glm4_moe_gives_the_resident_states_results(tmp_path):
    """A GPU budget of a few segments: the tiered state (ring + host pool) holds GLM-4.5's
    reordered keys; prefill moves old segments to the host, decode reads routed blocks there —
    and logits and greedy tokens equal the all-resident state's."""
    from docqa.engine.gpu.state import new_cuda_state
    from docqa.engine.gpu.tiering import TieredKVCache

    _, eng = tiny_glm(tmp_path, "glm4_moe")
    s = sparse(eng, top_k=3, segment_size=32)
    n = 192
    ids = ids_of(n, 2)
    c = eng.config
    per_tok = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
    plain = eng.new_state(n + 32, s)
    tiered = new_cuda_state(c, s, n + 32, eng.device, gpu_kv_bytes=(32 + 128) * per_tok + 2 * n * per_tok // 16)
    assert isinstance(tiered, TieredKVCache) and 2 * 32 <= tiered.ring < n
    la, lb = eng.prefill(ids, plain), eng.prefill(ids, tiered)
    assert tiered.evicted > tiered.pin and tiered.where(40) == "host"
    close(la, lb, "prefill")
    q = ids_of(3, 5)
    assert eng.generate(q, 4, state=tiered, stop_ids=()).token_ids == eng.generate(q, 4, state=plain, stop_ids=()).token_ids
