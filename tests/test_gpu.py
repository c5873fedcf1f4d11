"""The GPU path: KV tiering (also on CPU) and, on a CUDA machine, the graphed sparse model."""

from __future__ import annotations

import pytest
import torch

from docqa.engine.gpu.tiering import SegmentTiers
from docqa.kernels.gpu import has_cuda, has_triton, interpreting

pytestmark = pytest.mark.usefixtures("few_gemv_configs")
cuda = pytest.mark.skipif(not (has_cuda() and has_triton()), reason="needs a CUDA device and triton")


def _segments(n, shape=(2, 3, 4)):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(n)]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if has_cuda() else []))
def test_tiers_lru_roundtrip_through_cpu_and_disk(tmp_path, device):
    segs = _segments(6)
    tiers = SegmentTiers((2, 3, 4), torch.bfloat16, gpu_slots=2, cpu_slots=2, disk_dir=str(tmp_path), device=device)
    for i, s in enumerate(segs):
        tiers.put(i, s.to(device))
    # newest two on the fast tier, next two in CPU memory, oldest two on disk
    assert [tiers.tier(i) for i in range(6)] == ["disk", "disk", "cpu", "cpu", "gpu", "gpu"]
    for i, s in enumerate(segs):
        assert torch.equal(tiers.get(i).cpu(), s)
    got = tiers.fetch(0)  # disk -> cpu -> gpu, evicting the LRU GPU segment (4)
    tiers.wait(0)
    assert torch.equal(got.cpu(), segs[0]) and tiers.tier(0) == "gpu" and tiers.tier(4) == "cpu"
    tiers.fetch(5)  # touch: 5 becomes most recent, 0 the eviction candidate
    tiers.fetch(2)
    assert tiers.tier(0) == "cpu" and tiers.tier(5) == "gpu"
    for i, s in enumerate(segs):
        assert torch.equal(tiers.get(i).cpu(), s), i


def test_tiers_without_disk_refuse_to_overflow():
    tiers = SegmentTiers((4,), torch.float32, gpu_slots=1, cpu_slots=1, device="cpu")
    tiers.put(0, torch.ones(4))
    tiers.put(1, torch.ones(4))
    with pytest.raises(RuntimeError):
        tiers.put(2, torch.ones(4))


@cuda
def test_graphed_sparse_decode_matches_eager_and_dense_when_budget_covers_context():
    from docqa.engine.gpu.model import GraphedDecode, KVCache, Model, Routing, Shape, Weights

    shape = Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1000)
    w = Weights(shape)
    # top_k covers every block: sparse must reproduce dense attention
    model = Model(shape, w, Routing(sinks=4, window=128, block=64, top_k=64, route_chunk=128))
    n = 512
    toks = torch.randint(0, shape.vocab, (n,), device="cuda")
    kv = KVCache(shape, n + 8)
    logits = model.prefill(toks, kv, chunk=256)
    dkv = KVCache(shape, n + 8, layout="head")
    dense = model.prefill(toks, dkv, mode="dense")
    assert ((logits.float() - dense.float()).norm() / dense.float().norm()).item() < 2e-2
    g = GraphedDecode(model, kv, n)
    g.tok.fill_(int(toks[-1]))
    g.replay()
    graphed = g.tok.clone()
    tok = toks[-1:].clone()
    pos = torch.tensor([n], dtype=torch.int32, device="cuda")
    model.decode_step(tok, pos, kv)
    assert torch.equal(tok, graphed) and int(g.pos) == n + 1


@pytest.mark.skipif(not has_triton() or not (has_cuda() or __import__("os").environ.get("TRITON_INTERPRET") == "1"),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("attention", ["sparse", "dense"])
def test_triton_state_matches_sparse_state(attention):
    """The Triton KV state gives the CPU reference state's outputs (true positions), chunk by chunk."""
    from docqa.engine.config import ModelConfig
    from docqa.engine.gpu.state import TritonKVState
    from docqa.engine.settings import EngineSettings
    from docqa.engine.sparse_state import SparseKVState

    dev = "cuda" if has_cuda() else "cpu"
    cfg = ModelConfig(arch="llama", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=64,
                      vocab=10, rope_theta=10000.0, max_position=4096, rms_eps=1e-6, tie_embeddings=False,
                      qkv_bias=False, qk_norm=False)
    st = EngineSettings(attention=attention, sink_tokens=2, window=16, block_size=16, top_k=2, segment_size=64,
                        chunk_size=16, positions="true", dense_below=0)
    ref, fast = SparseKVState(cfg, st, device=dev), TritonKVState(cfg, st, capacity=32, device=dev)
    g = torch.Generator().manual_seed(0)
    for t in [16] * 4 + [1, 1]:  # prefill chunks, then decode steps (the buffers grow)
        pos = torch.arange(ref.num_tokens, ref.num_tokens + t, device=dev)
        for layer in range(cfg.n_layers):
            q, k, v = (torch.randn(t, h, 16, generator=g).to(dev) for h in (4, 2, 2))
            a = ref.attend(layer, q, k, v, pos)
            b = fast.attend(layer, q, k, v, pos)
            assert ((a - b).norm() / a.norm()).item() < 2e-3, (t, layer)
        ref.commit(t)
        fast.commit(t)
    assert attention == "dense" or not ref.exact  # routing really left blocks out
    fast.truncate(40)
    assert fast.num_tokens == 40


@pytest.mark.skipif(not has_triton() or not (has_cuda() or __import__("os").environ.get("TRITON_INTERPRET") == "1"),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
def test_triton_state_routes_the_tail_like_the_sparse_state():
    """Several routing chunks per call plus a routing tail: the same chunks, blocks and outputs."""
    from docqa.engine.config import ModelConfig
    from docqa.engine.gpu.state import TritonKVState
    from docqa.engine.settings import EngineSettings
    from docqa.engine.sparse_state import SparseKVState

    dev = "cuda" if has_cuda() else "cpu"
    cfg = ModelConfig(arch="llama", n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=64,
                      vocab=10, rope_theta=10000.0, max_position=4096, rms_eps=1e-6, tie_embeddings=False,
                      qkv_bias=False, qk_norm=False)
    st = EngineSettings(sink_tokens=2, window=16, block_size=16, top_k=2, segment_size=64, chunk_size=64,
                        route_chunk=24, route_tail=5, positions="true", dense_below=0)
    ref, fast = SparseKVState(cfg, st, device=dev), TritonKVState(cfg, st, capacity=32, device=dev)
    g = torch.Generator().manual_seed(1)
    for t in [64, 64, 1]:
        pos = torch.arange(ref.num_tokens, ref.num_tokens + t, device=dev)
        q, k, v = (torch.randn(t, h, 16, generator=g).to(dev) for h in (4, 2, 2))
        a = ref.attend(0, q, k, v, pos)
        b = fast.attend(0, q, k, v, pos)
        assert ((a - b).norm() / a.norm()).item() < 2e-3, t
        ref.commit(t)
        fast.commit(t)
    assert not ref.exact


@pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
def test_bench_model_decode_same_tokens_with_fused_gemv_or_plain_matmuls():
    """The bench model's decode step with its projections in the fused GEMV (norm / SwiGLU /
    residual folded in) against the same step with plain matmuls and separate kernels: same
    greedy tokens, same position bookkeeping, over a context long enough to route."""
    from docqa.engine.gpu.model import GEMV_ALL, KVCache, Model, Routing, Shape, Weights

    dev = "cuda" if has_cuda() and not interpreting() else "cpu"
    shape = Shape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=100)
    weights = Weights(shape, device=dev)
    routing = Routing(sinks=4, window=32, block=16, top_k=2, route_chunk=64)
    n = 128  # 8 blocks: past sinks + top-2 + window, so decode really routes
    toks = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(0)).to(dev)
    model = Model(shape, weights, routing)
    kv = KVCache(shape, 256, block=16, device=dev)
    model.prefill(toks, kv, chunk=128)
    runs = []
    for gemv in (GEMV_ALL, ()):  # the default is a subset of the first; CUDA runs cover it in bench/gpu.py
        model.gemv = gemv
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        pos = torch.tensor([n], dtype=torch.int32, device=dev)
        out = []
        for _ in range(3):
            model.decode_step(tok, pos, kv)
            out.append(int(tok))
        assert int(pos) == n + 3
        runs.append(out)
    assert runs[0] == runs[1]
    # the descriptors decode kept up to date (routing reads the mean) equal the reference's
    from docqa.kernels.attention.naive import naive_block_descriptors

    rmin, rmax, rmean = naive_block_descriptors(kv.k[1, : n + 3].float(), 16)
    nb = rmin.shape[0]
    assert torch.equal(kv.kmin[1, :nb].float(), rmin.to(torch.bfloat16).float())
    assert torch.allclose(kv.kmean[1, :nb].float(), rmean, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
def test_bench_model_prefill_fused_store_and_unsorted_topk_match_torch_ops():
    """Prefill with the one-kernel KV store (+ descriptors) and the unsorted routing top-k gives
    the caches, descriptors and logits of the torch-op path, over chunks that really route."""
    from docqa.engine.gpu.model import KVCache, Model, Routing, Shape, Weights

    dev = "cuda" if has_cuda() and not interpreting() else "cpu"
    shape = Shape(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=100)
    weights = Weights(shape, device=dev)
    routing = Routing(sinks=4, window=32, block=16, top_k=2, route_chunk=32, route_tail=8)
    toks = torch.randint(0, 100, (120,), generator=torch.Generator().manual_seed(1)).to(dev)
    model = Model(shape, weights, routing)
    outs = []
    for fast in (True, False):
        model.fused_store = model.fast_topk = fast
        kv = KVCache(shape, 128, block=16, device=dev)
        logits = model.prefill(toks, kv, chunk=56)  # chunks end mid-block: partial descriptors
        outs.append((logits.float(), kv))
    (la, ka), (lb, kb) = outs
    n = 120
    assert torch.equal(ka.k[:, :n], kb.k[:, :n]) and torch.equal(ka.v[:, :n], kb.v[:, :n])
    nb = -(-n // 16)
    assert torch.equal(ka.kmin[:, :nb], kb.kmin[:, :nb]) and torch.equal(ka.kmax[:, :nb], kb.kmax[:, :nb])
    assert torch.allclose(ka.kmean[:, :nb].float(), kb.kmean[:, :nb].float(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(ka.ksum, kb.ksum, rtol=1e-3, atol=1e-3)
    assert ((la - lb).norm() / lb.norm()).item() < 1e-2


@pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
def _greedy_decode(model, kv, n: int, steps: int, between=None) -> list[int]:
    """Greedy tokens of `steps` eager decode steps from position n (`between` runs after each)."""
    dev = kv.k.device
    tok = torch.zeros(1, dtype=torch.long, device=dev)
    pos = torch.tensor([n], dtype=torch.int32, device=dev)
    seq = []
    for _ in range(steps):
        model.decode_step(tok, pos, kv)
        seq.append(int(tok))
        if between is not None:
            between()
    return seq


def test_tiered_kv_cache_gives_the_resident_caches_results():
    """The bench model over a TieredKVCache whose GPU ring holds a fraction of the context (the
    rest moved to the host pool segment by segment during prefill and decode) gives the same
    logits and greedy tokens as over the all-resident KVCache; the host pool holds the moved
    keys, and both caches hold the same block descriptors (so routing sees the same scores;
    which picks fell in the host pool is not asserted here — test_triton_kernels.py's far-pool
    test checks host-pool reads, in place and staged, against the reference)."""
    from docqa.engine.gpu.model import KVCache, Model, Routing, Shape, Weights
    from docqa.engine.gpu.tiering import TieredKVCache

    dev = "cuda" if has_cuda() and not interpreting() else "cpu"
    shape = Shape(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=100)
    weights = Weights(shape, device=dev)
    routing = Routing(sinks=4, window=32, block=16, top_k=3, route_chunk=32, route_tail=8)
    n, chunk, steps = 192, 64, 4
    toks = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(2)).to(dev)
    model = Model(shape, weights, routing)
    plain = KVCache(shape, n + steps, block=16, device=dev)
    tiered = TieredKVCache(shape, n + steps, 32 + 96, block=16, segment=32, device=dev)
    assert tiered.ring == 96
    outs = []
    for kv in (plain, tiered):
        logits = model.prefill(toks, kv, chunk=chunk)
        if kv is tiered:
            assert kv.evicted == 96 and kv.where(40) == "host"
            kv.prepare(n, n + steps)
        outs.append((logits.float(), _greedy_decode(model, kv, n, steps)))
    (la, sa), (lb, sb) = outs
    assert ((la - lb).norm() / la.norm()).item() < 1e-2
    assert sa == sb
    if dev == "cuda":
        torch.cuda.synchronize()
    for p in (32, 100, tiered.evicted - 1):  # moved keys sit in the host pool at row p - pin
        assert tiered.where(p) == "host"
        assert torch.equal(tiered.hk[:, p - 32].to(dev), plain.k[:, p])
    assert tiered.moves["segments_to_host"] >= (tiered.evicted - 32) // 32
    # the descriptors of the two caches agree, so both route alike
    assert torch.equal(tiered.kmin[:, : n // 16], plain.kmin[:, : n // 16])


@pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                    reason="needs triton and either CUDA or TRITON_INTERPRET=1")
def test_tiered_kv_cache_with_disk_tier_and_promotion_gives_the_resident_caches_results(tmp_path, monkeypatch):
    """A ring of 3 segments, a host pool of 6 and 2 hot slots for a 12-segment context: prefill
    sends segments to disk, routing picks some of them back (in prefill and in decode), decode
    promotes its most-picked host segments to the hot slots — and the logits and greedy tokens
    are the all-resident KVCache's. Every attention launch is checked on its way in: no block it
    reads (picks, sinks, window) has an ON_DISK table entry."""
    from docqa.engine.gpu import model as gpu_model
    from docqa.engine.gpu.model import GraphedDecode, KVCache, Model, Routing, Shape, Weights
    from docqa.engine.gpu.tiering import ON_DISK, TieredKVCache

    dev = "cuda" if has_cuda() and not interpreting() else "cpu"
    shape = Shape(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=100)
    weights = Weights(shape, device=dev)
    routing = Routing(sinks=4, window=32, block=16, top_k=2, route_chunk=32, route_tail=8)
    n, chunk, steps, seg = 384, 64, 6, 32
    toks = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(3)).to(dev)
    model = Model(shape, weights, routing, gemv=())  # plain decode projections: the interpreter's GEMV is slow
    plain = KVCache(shape, n + steps, block=16, device=dev)
    tiered = TieredKVCache(shape, n + steps, seg * (1 + 3 + 2), block=16, segment=seg, device=dev, host_segments=6,
                           disk_dir=str(tmp_path), hot_segments=2)
    assert tiered.ring == 3 * seg and tiered.host_slots == 6

    launches = []  # per tiered launch: (segments on disk at the time, picks read from hot slots)
    resident_decode_picks = []
    real = gpu_model.fused_sparse_attention

    def checked(q, k, v, q_offset, block_idx, block_size, sinks, window, **kw):
        table = kw.get("block_table")
        if table is None and q.shape[0] == 1:
            resident_decode_picks.append(block_idx.reshape(-1).clone())
        if table is not None:
            q0, t = int(q_offset), q.shape[0]
            lo, hi = max(q0 - window + 1, 0) // block_size, (q0 + t - 1) // block_size
            picks = table[block_idx.reshape(-1).clamp_min(0)]
            read = torch.cat([picks, table[lo: hi + 1], table[:1]])
            assert not (read == ON_DISK).any(), "an ON_DISK table entry reached the attention kernel"
            launches.append((len(tiered.disk), int((picks >= tiered.hot_row0 // block_size).sum())))
        return real(q, k, v, q_offset, block_idx, block_size, sinks, window, **kw)

    monkeypatch.setattr(gpu_model, "fused_sparse_attention", checked)
    outs = []
    for kv in (plain, tiered):
        logits = model.prefill(toks, kv, chunk=chunk)
        if kv is tiered:
            assert kv.disk and kv.moves["segments_to_disk"] >= 2
            with pytest.raises(RuntimeError, match="on disk"):
                GraphedDecode._refuse_disk(kv)  # a graph has no fault check
            kv.prepare(n, n + steps)
            # Seed the counts with the picks the first step will make (the resident run's: same
            # descriptors, same routing), so promotion deterministically serves reads in this test;
            # three rebalances: snapshot, promote (copy), point the table at the hot rows.
            kv.record_use(resident_decode_picks[0])
            for _ in range(3):
                kv.rebalance()
            assert kv.hot
        between = tiered.rebalance if kv is tiered else None
        outs.append((logits.float(), _greedy_decode(model, kv, n, steps, between)))
    (la, sa), (lb, sb) = outs
    assert ((la - lb).norm() / la.norm()).item() < 1e-2
    assert sa == sb
    m = tiered.moves
    assert m["segments_to_disk"] > 0 and m["segments_from_disk"] > 0 and m["bytes_disk_io"] > 0
    assert m["promotions"] > 0 and tiered.hot
    assert any(d for d, _ in launches), "no launch ran with segments on disk"
    assert sum(h for _, h in launches) > 0, "no pick was read from a hot slot"
    # every tier holds the very keys the resident cache has
    if dev == "cuda":
        torch.cuda.synchronize()
    where = {tiered.where(p) for p in range(tiered.pin, tiered.evicted, seg)}
    assert {"hot", "host", "disk"} <= where
    for seg_id, slot in tiered.host_slot.items():
        p = seg_id * seg
        assert torch.equal(tiered.hk[:, slot * seg: (slot + 1) * seg].to(dev), plain.k[:, p: p + seg])
    for seg_id, slot in tiered.hot.items():
        p, r = seg_id * seg, tiered.hot_row0 + slot * seg
        assert torch.equal(tiered.k[:, r: r + seg], plain.k[:, p: p + seg])
    tiered.close()
    assert not list(tmp_path.iterdir())
