"""Triton kernels against their PyTorch references, on awkward shapes.

On CPU these run under TRITON_INTERPRET=1 (scripts/test.sh sets it) on tiny shapes; on a
CUDA machine the same cases run on the GPU. Outputs are poisoned with NaN first so an
unwritten element fails the check.
"""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

pytestmark = [pytest.mark.usefixtures("few_gemv_configs"), pytest.mark.skipif(
    not has_triton() or not (has_cuda() or interpreting()),
    reason="needs triton and either CUDA or TRITON_INTERPRET=1",
)]

DEVICE = "cuda" if has_cuda() and not interpreting() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 60), (63, 60), (5, 3, 128), (7, 4096)])
def test_rms_norm(shape, dtype):
    from docqa.kernels.norm import fused_rms_norm, naive_rms_norm

    g = torch.Generator().manual_seed(hash(shape) % 1000)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    w = torch.randn(shape[-1], generator=g).to(DEVICE, dtype)
    out = fused_rms_norm(x, w, 1e-5, out=poisoned(x))
    assert rel_err(out, naive_rms_norm(x, w, 1e-5)) < TOL[dtype]


def test_rms_norm_rejects_bad_weight():
    from docqa.kernels.norm import fused_rms_norm

    with pytest.raises(ValueError):
        fused_rms_norm(torch.zeros(2, 8, device=DEVICE), torch.zeros(7, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,d", [(1, 1, 2), (63, 3, 60), (17, 8, 128)])
def test_rope(t, h, d, dtype):
    from docqa.kernels.rope import fused_rope, naive_rope, rope_cos_sin

    g = torch.Generator().manual_seed(t * 100 + d)
    x = torch.randn(t, h, d, generator=g).to(DEVICE, dtype)
    pos = torch.randint(0, 1 << 20, (t,), generator=g).to(DEVICE)
    cos, sin = rope_cos_sin(pos, d)
    ref = naive_rope(x, cos, sin)
    assert rel_err(fused_rope(x, cos, sin, out=poisoned(x)), ref) < TOL[dtype]
    # in place, on a strided view (q of a fused qkv projection)
    qkv = torch.randn(t, h + 2, d, generator=g).to(DEVICE, dtype)
    q = qkv[:, :h]
    ref2 = naive_rope(q, cos, sin)
    fused_rope(q, cos, sin, out=q)
    assert rel_err(q, ref2) < TOL[dtype]


def test_rope_matches_rotate_half_formula():
    from docqa.kernels.rope import naive_rope, rope_cos_sin

    x = torch.randn(5, 2, 8, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(5), 8)
    c, s = torch.cat([cos, cos], -1)[:, None].double(), torch.cat([sin, sin], -1)[:, None].double()
    rot = torch.cat([-x[..., 4:], x[..., :4]], -1)
    assert torch.allclose(naive_rope(x, cos, sin), x * c + rot * s, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 60), (63, 60), (3, 5000)])
def test_swiglu(shape, dtype):
    from docqa.kernels.swiglu import fused_swiglu, naive_swiglu

    g = torch.Generator().manual_seed(shape[-1])
    gu = (torch.randn(shape[0], 2 * shape[1], generator=g) * 4).to(DEVICE, dtype)
    gate, up = gu[:, : shape[1]], gu[:, shape[1]:]  # strided halves of one projection
    out = fused_swiglu(gate, up, out=poisoned(gate.contiguous()))
    assert rel_err(out, naive_swiglu(gate, up)) < TOL[dtype]


# --- attention: mirrors kernels/attention/naive.py -------------------------------------------

ATT_TOL = {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # tf32 dots on GPU


def _qkv(t, hq, hkv, d, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, hq, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(n, hkv, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(n, hkv, d, generator=g).to(DEVICE, dtype)
    return q, k, v


@pytest.mark.parametrize("method", ["minmax", "mean"])
@pytest.mark.parametrize("t,hq,hkv,d,n,bs", [(1, 4, 2, 60, 200, 16), (7, 6, 3, 32, 130, 32)])
def test_block_scores(method, t, hq, hkv, d, n, bs):
    from docqa.kernels.attention.naive import naive_block_descriptors, naive_block_scores
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = _qkv(t, hq, hkv, d, n, torch.float32, seed=n + t)
    kmin, kmax, kmean = naive_block_descriptors(k, bs)
    ref = naive_block_scores(q, kmin, kmax, kmean, method)
    out = fused_block_scores(q, kmin, kmax, kmean, method)
    assert rel_err(out, ref) < 2e-3


def test_topk_blocks_matches_reference_and_pads():
    from docqa.kernels.attention.naive import naive_topk_blocks
    from docqa.kernels.attention.triton_topk import fused_topk_blocks

    scores = torch.randn(3, 20, device=DEVICE)
    ref = naive_topk_blocks(scores, 4, 1, 15)
    got = fused_topk_blocks(scores, 4, 1, torch.tensor(15, device=DEVICE))
    assert torch.equal(got, ref)
    few = fused_topk_blocks(scores, 4, 2, 4)
    assert torch.equal(few[:, :2], naive_topk_blocks(scores, 4, 2, 4)) and (few[:, 2:] == -1).all()


SPARSE_CASES = [
    # t, hq, hkv, d, n_keys, block, sinks, window, top_k
    (1, 4, 2, 60, 200, 16, 3, 24, 3),  # decode: split-KV path, D=60
    (9, 4, 1, 32, 150, 16, 4, 20, 2),  # a prefill chunk at the end of the keys
    (63, 2, 2, 16, 63, 16, 0, 8, 1),  # chunk from position 0, no sinks
]


@pytest.mark.parametrize("case", SPARSE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_attention(case, dtype):
    from docqa.kernels.attention.naive import naive_sparse_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k = case
    q, k, v = _qkv(t, hq, hkv, d, n, dtype, seed=sum(case))
    nb = -(-n // bs)
    g = torch.Generator().manual_seed(7)
    idx = torch.stack([torch.randperm(nb, generator=g)[:top_k] for _ in range(hkv)]).to(DEVICE)
    idx[0, -1] = -1  # an unused slot
    off = n - t
    ref_o, ref_l = naive_sparse_attention(q, k, v, off, idx, bs, sinks, window)
    out = torch.full((t, hq, d), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((t, hq), float("nan"), device=DEVICE)
    for off_arg in (off, torch.tensor([off], device=DEVICE, dtype=torch.int32)):
        o, l = fused_sparse_attention(q, k, v, off_arg, idx, bs, sinks, window, out=out, lse=lse)
        assert rel_err(o, ref_o) < ATT_TOL[dtype]
        assert rel_err(l, ref_l) < 1e-3


@pytest.mark.parametrize("splits", [1, 3])
def test_sparse_attention_paged_pool_and_splits(splits):
    """Keys stored in a shuffled page pool through a block table give the same result."""
    from docqa.kernels.attention.naive import naive_sparse_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs = 2, 4, 2, 32, 96, 16
    q, k, v = _qkv(t, hq, hkv, d, n, torch.float32, seed=3)
    nb = n // bs
    perm = torch.randperm(nb + 2, generator=torch.Generator().manual_seed(1))[:nb].to(DEVICE)
    kp = torch.randn((nb + 2) * bs, hkv, d, device=DEVICE)
    vp = torch.randn((nb + 2) * bs, hkv, d, device=DEVICE)
    rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)
    kp[rows], vp[rows] = k, v
    idx = torch.tensor([[0, 2], [1, -1]], device=DEVICE)
    ref_o, ref_l = naive_sparse_attention(q, k, v, n - t, idx, bs, 2, 20)
    o, l = fused_sparse_attention(q, kp, vp, n - t, idx, bs, 2, 20, block_table=perm.int(), num_splits=splits)
    assert rel_err(o, ref_o) < ATT_TOL[torch.float32] and rel_err(l, ref_l) < 1e-3


def test_dense_equals_reference():
    from docqa.kernels.attention.naive import naive_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_attention

    q, k, v = _qkv(5, 4, 2, 32, 40, torch.float32, seed=11)
    ref_o, ref_l = naive_attention(q, k, v, 30)
    o, l = fused_attention(q, k, v, 30)
    assert rel_err(o, ref_o) < ATT_TOL[torch.float32] and rel_err(l, ref_l) < 1e-3


@pytest.mark.parametrize("hq", [8, 6])  # GQA groups of 4 and of 3 (SmolLM2's: no power-of-two tile)
def test_routing_chunks_in_one_launch(hq):
    """[C, Hkv, K] selections (one per routing chunk) equal C separate reference calls."""
    from docqa.kernels.attention.naive import naive_block_descriptors, naive_sparse_attention
    from docqa.kernels.attention.triton_block_scores import fused_block_scores
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hkv, d, n, bs, chunk = 32, 2, 32, 160, 16, 16
    q, k, v = _qkv(t, hq, hkv, d, n, torch.float32, seed=5)
    kmin, kmax, kmean = naive_block_descriptors(k, bs)
    per_chunk = fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk)
    assert per_chunk.shape == (2, hkv, n // bs)
    assert rel_err(per_chunk[1], fused_block_scores(q[chunk:], kmin, kmax, kmean)) < 1e-5
    idx = torch.tensor([[[0, 3], [2, -1]], [[5, 1], [4, 6]]], device=DEVICE)
    o, l = fused_sparse_attention(q, k, v, n - t, idx, bs, 2, 24)
    for c in range(2):
        sl = slice(c * chunk, (c + 1) * chunk)
        ro, rl = naive_sparse_attention(q[sl], k, v, n - t + c * chunk, idx[c], bs, 2, 24)
        assert rel_err(o[sl], ro) < ATT_TOL[torch.float32] and rel_err(l[sl], rl) < 1e-3


def test_append_kv_keeps_descriptors_equal_to_reference():
    from docqa.kernels.attention.naive import naive_block_descriptors
    from docqa.kernels.attention.triton_kvstore import fused_append_kv

    n, hkv, d, bs = 40, 2, 60, 16
    k = torch.randn(n, hkv, d, device=DEVICE)
    v = torch.randn(n, hkv, d, device=DEVICE)
    kc, vc = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    kmin = torch.randn(3, hkv, d, device=DEVICE)  # stale contents must be forgotten
    kmax, kmean = kmin.clone(), kmin.clone()
    ksum = torch.randn(hkv, d, device=DEVICE)
    for p in range(n):
        fused_append_kv(k[p:p + 1], v[p:p + 1], kc, vc, kmin, kmax, torch.tensor([p], device=DEVICE), bs,
                        kmean=kmean, ksum=ksum)
    rmin, rmax, rmean = naive_block_descriptors(k, bs)
    assert torch.equal(kc, k) and torch.equal(vc, v)
    assert torch.equal(kmin, rmin) and torch.equal(kmax, rmax)
    assert torch.allclose(kmean, rmean, atol=1e-6)  # the last block is partial: its mean so far


def test_block_scores_candidate_mask():
    from docqa.kernels.attention.naive import naive_block_descriptors, naive_block_scores
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = _qkv(1, 4, 2, 32, 128, torch.float32, seed=2)
    kmin, kmax, kmean = naive_block_descriptors(k, 16)
    ref = naive_block_scores(q, kmin, kmax, kmean)
    got = fused_block_scores(q, kmin, kmax, kmean, candidates=(1, torch.tensor([5], device=DEVICE)))
    assert torch.isinf(got[:, [0, 5, 6, 7]]).all()
    assert rel_err(got[:, 1:5], ref[:, 1:5]) < 2e-3


def test_rope_accepts_engine_cos_sin_layout():
    from docqa.kernels.rope import fused_rope, naive_rope, rope_cos_sin

    x = torch.randn(9, 3, 60, device=DEVICE)
    cos, sin = rope_cos_sin(torch.arange(9, device=DEVICE) + 1000, 60)
    hf_cos, hf_sin = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    assert rel_err(fused_rope(x, hf_cos, hf_sin), naive_rope(x, cos, sin)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 37, 200), (3, 64, 129), (1, 8, 64)])
@pytest.mark.parametrize("fusion", ["plain", "norm", "norm+swiglu", "residual"])
def test_gemv(m, n, k, fusion, dtype):
    from docqa.kernels.linear import fused_gemv, naive_gemv

    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = (torch.randn(m, k, generator=g) * 2).to(DEVICE, dtype)
    rows = 2 * n if "swiglu" in fusion else n
    w = (torch.randn(rows, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    kw = {}
    if "norm" in fusion:
        kw.update(norm_weight=(1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE, dtype), eps=1e-5)
    if "swiglu" in fusion:
        kw.update(swiglu=True)
    if fusion == "residual":
        kw.update(residual=torch.randn(m, n, generator=g).to(DEVICE, dtype))
    ref = naive_gemv(x, w, **kw)
    out = fused_gemv(x, w, out=poisoned(ref), **kw)
    assert rel_err(out, ref) < TOL[dtype]


def test_gemv_refuses_what_it_cannot_do():
    from docqa.kernels.linear import fused_gemv

    x = torch.randn(1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="do not multiply"):
        fused_gemv(x, torch.randn(4, 9, device=DEVICE))
    with pytest.raises(ValueError, match="use a GEMM"):
        fused_gemv(torch.randn(17, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="even number"):
        fused_gemv(x, torch.randn(5, 8, device=DEVICE), swiglu=True)


@pytest.mark.parametrize("nb", [16, 100, 1024, 2500])
def test_decode_topk_matches_torch_topk(nb):
    from docqa.kernels.attention.triton_topk import fused_decode_topk

    g = torch.Generator().manual_seed(nb)
    scores = torch.randn(3, nb, generator=g).to(DEVICE)
    scores[1, nb // 2:] = float("-inf")  # non-candidates: picked only when too few candidates
    got = fused_decode_topk(scores, 16)
    want = torch.topk(scores, 16, dim=-1).indices
    for row in range(3):
        picked = got[row].tolist()
        assert len(set(picked)) == 16 and 0 <= min(picked) and max(picked) < nb  # distinct, in range
        best = [i for i in want[row].tolist() if torch.isfinite(scores[row, i])]
        assert set(best) <= set(picked)  # every finite winner of torch.topk is picked


# --- 2026-11-30 (session 3): wide key tiles, unmasked score tiles, tile-size top-k, argmax -----


@pytest.mark.parametrize("case", [
    # t, hq, hkv, d, n_keys, block, sinks, window, top_k: windows of several blocks, so tiles
    # that every query of a program sees whole (unmasked path) mix with partial ones
    (8, 4, 2, 32, 260, 16, 4, 48, 3),
    (40, 2, 2, 16, 300, 16, 20, 64, 4),  # sinks wider than a block, several query tiles
    (1, 4, 2, 32, 200, 16, 3, 40, 3),  # decode, split-KV
])
def test_sparse_attention_whole_tiles_unmasked(case):
    """Skipping the mask on tiles every row sees whole gives the reference result, with -1
    slots and selected blocks inside some rows' windows, through a paged pool too."""
    from docqa.kernels.attention.naive import naive_sparse_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k = case
    q, k, v = _qkv(t, hq, hkv, d, n, torch.float32, seed=sum(case))
    nb = -(-n // bs)
    g = torch.Generator().manual_seed(t)
    idx = torch.stack([torch.randperm(nb, generator=g)[:top_k] for _ in range(hkv)]).to(DEVICE)
    idx[-1, 0] = -1
    idx[0, 1] = (n - t - window) // bs  # a block inside the window of some queries only
    off = n - t
    ref_o, ref_l = naive_sparse_attention(q, k, v, off, idx, bs, sinks, window)
    for splits in (1, 2):
        out = torch.full((t, hq, d), float("nan"), device=DEVICE)
        lse = torch.full((t, hq), float("nan"), device=DEVICE)
        o, l = fused_sparse_attention(q, k, v, off, idx, bs, sinks, window, out=out, lse=lse, num_splits=splits)
        assert rel_err(o, ref_o) < ATT_TOL[torch.float32] and rel_err(l, ref_l) < 1e-3
    perm = torch.randperm(nb + 1, generator=g)[:nb].to(DEVICE)
    kp = torch.randn((nb + 1) * bs, hkv, d, device=DEVICE)
    vp = torch.randn((nb + 1) * bs, hkv, d, device=DEVICE)
    kpad = torch.cat([k, k.new_zeros(nb * bs - n, hkv, d)])
    vpad = torch.cat([v, v.new_zeros(nb * bs - n, hkv, d)])
    rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)
    kp[rows], vp[rows] = kpad, vpad
    o, l = fused_sparse_attention(q, kp, vp, off, idx, bs, sinks, window, block_table=perm.int())
    assert rel_err(o, ref_o) < ATT_TOL[torch.float32] and rel_err(l, ref_l) < 1e-3


@pytest.mark.parametrize("method", ["minmax", "mean"])
@pytest.mark.parametrize("t,chunk", [(8, 4), (7, 7), (5, 2)])
def test_block_scores_unmasked_row_tiles(method, t, chunk):
    """Whole row tiles (no mask) then a ragged one: rows = chunk * group over 16-row tiles."""
    from docqa.kernels.attention.naive import naive_block_descriptors, naive_block_scores
    from docqa.kernels.attention.triton_block_scores import fused_block_scores

    q, k, _ = _qkv(t, 8, 2, 32, 100, torch.float32, seed=t * 10 + chunk)
    q[::2] *= -3.0  # all-negative-ish rows must not lose to padding
    kmin, kmax, kmean = naive_block_descriptors(k, 16)
    out = fused_block_scores(q, kmin, kmax, kmean, method, chunk=chunk, tile=(16, 32))
    for c in range(out.shape[0]):
        ref = naive_block_scores(q[c * chunk:(c + 1) * chunk], kmin, kmax, kmean, method)
        assert rel_err(out[c], ref) < 2e-3


def test_decode_topk_small_tiles_many_blocks():
    """Past 1024 blocks the first pass uses tiles of 256..1024 (>= 2 tiles): same winners."""
    from docqa.kernels.attention.triton_topk import fused_decode_topk

    for nb in (1025, 2048, 4100):
        scores = torch.randn(2, nb, generator=torch.Generator().manual_seed(nb)).to(DEVICE)
        scores[1, :nb - 5] = float("-inf")  # 5 candidates only: the rest filled from non-candidates
        got = fused_decode_topk(scores, 16)
        want = torch.topk(scores[0], 16).indices
        assert set(got[0].tolist()) == set(want.tolist())
        assert set(range(nb - 5, nb)) <= set(got[1].tolist()) and len(set(got[1].tolist())) == 16


@pytest.mark.parametrize("n", [7, 4096, 10000])
def test_argmax_matches_torch(n):
    from docqa.kernels.sampling.triton_argmax import fused_argmax

    x = torch.randn(1, n, generator=torch.Generator().manual_seed(n)).to(DEVICE, torch.bfloat16)
    x[0, n // 3] = x[0, -1] = 50.0  # a tie: the first index wins, as in torch.argmax
    out = torch.full((1,), -7, dtype=torch.long, device=DEVICE)
    fused_argmax(x, out=out)
    assert out.item() == x.argmax(-1).item() == n // 3


@pytest.mark.parametrize("start,t", [(0, 32), (10, 40), (16, 5)])
def test_store_kv_blocks_matches_reference_descriptors(start, t):
    """A prefill chunk's KV store with its descriptors, partial blocks at both ends: the cache
    holds the keys, and every touched block's min/max/mean (over earlier keys too) and the
    last block's fp32 sum equal the reference."""
    from docqa.kernels.attention.naive import naive_block_descriptors
    from docqa.kernels.attention.triton_kvstore import fused_store_kv_blocks

    hkv, d, bs, n_cap = 2, 24, 16, 64
    g = torch.Generator().manual_seed(start * 100 + t)
    keys = torch.randn(start + t, hkv, d, generator=g).to(DEVICE)
    vals = torch.randn(start + t, hkv, d, generator=g).to(DEVICE)
    kc = torch.full((n_cap, hkv, d), float("nan"), device=DEVICE)
    vc = torch.full((n_cap, hkv, d), float("nan"), device=DEVICE)
    kc[:start], vc[:start] = keys[:start], vals[:start]
    nb = n_cap // bs
    kmin, kmax, kmean = (torch.full((nb, hkv, d), float("nan"), device=DEVICE) for _ in range(3))
    ksum = torch.full((hkv, d), float("nan"), device=DEVICE)
    qkv = torch.cat([keys[start:], vals[start:]], dim=1)  # strided views, as in the model
    fused_store_kv_blocks(qkv[:, :hkv], qkv[:, hkv:], kc, vc, kmin, kmax, start, bs, kmean=kmean, ksum=ksum)
    end = start + t
    assert torch.equal(kc[:end], keys) and torch.equal(vc[:end], vals)
    assert torch.isnan(kc[end:]).all()  # nothing past the chunk written
    rmin, rmax, rmean = naive_block_descriptors(keys, bs)
    b0, b1 = start // bs, -(-end // bs)
    assert torch.equal(kmin[b0:b1], rmin[b0:b1]) and torch.equal(kmax[b0:b1], rmax[b0:b1])
    assert torch.allclose(kmean[b0:b1], rmean[b0:b1], atol=1e-6)
    assert torch.isnan(kmin[b1:]).all() and (b0 == 0 or torch.isnan(kmin[:b0]).all())
    last = keys[(b1 - 1) * bs:end].sum(0)
    assert torch.allclose(ksum, last, atol=1e-5)


@pytest.mark.parametrize("nb,end", [(20, 15), (20, 3), (1500, 1400)])
def test_topk_blocks_unsorted_same_sets_as_reference(nb, end):
    """Prefill routing's unsorted top-k: per routing chunk and head the same ids as the
    reference (chunk-wise candidate ends), -1 for the slots no candidate fills."""
    from docqa.kernels.attention.naive import naive_topk_blocks
    from docqa.kernels.attention.triton_topk import fused_topk_blocks_unsorted

    scores = torch.randn(2, 3, nb, generator=torch.Generator().manual_seed(nb + end)).to(DEVICE)
    ends = torch.tensor([end, end - 2], device=DEVICE)[:, None, None]
    got = fused_topk_blocks_unsorted(scores, 8, 1, ends)
    assert got.shape == (2, 3, 8)
    for c in range(2):
        ref = naive_topk_blocks(scores[c], 8, 1, int(ends[c]))
        for h in range(3):
            want = [i for i in ref[h].tolist() if i >= 0]
            have = got[c, h].tolist()
            assert sorted(i for i in have if i >= 0) == sorted(want)
            assert have.count(-1) == 8 - len(want)


def _stale_caches(rows: int, blocks: int, hkv: int, d: int, dtype) -> tuple:
    """K/V caches of NaN (an unwritten row shows) and descriptors / key sum holding stale
    values (a block's first key must replace them): the same for every caller."""
    kc = torch.full((rows, hkv, d), float("nan"), device=DEVICE, dtype=dtype)
    desc = [torch.randn(blocks, hkv, d, generator=torch.Generator().manual_seed(9)).to(DEVICE, dtype) for _ in range(3)]
    ksum = torch.randn(hkv, d, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    return (kc, kc.clone(), *desc, ksum)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_qkv_gemv_rope_append_matches_separate_ops(cache_dtype):
    """The decode qkv projection with RoPE, KV append and descriptor updates folded in equals
    the reference GEMV + reference RoPE + the append kernel, over steps that open a block."""
    from docqa.kernels.attention.triton_kvstore import fused_append_kv
    from docqa.kernels.linear import fused_qkv_gemv, naive_gemv
    from docqa.kernels.rope import naive_rope, rope_cos_sin

    hq, hkv, d, k, bs = 4, 2, 16, 48, 4
    n = (hq + 2 * hkv) * d
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(DEVICE)
    caches = [_stale_caches(12, 3, hkv, d, cache_dtype) for _ in range(2)]
    for p in (2, 3, 4, 5):  # 4 opens block 1: stale descriptors must be forgotten
        x = torch.randn(1, k, generator=g).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE, dtype=torch.int32)
        cos, sin = rope_cos_sin(pos, d)
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        ref = naive_gemv(x, w, norm_weight=nw, eps=1e-5)
        qk = naive_rope(ref[:, : (hq + hkv) * d].view(1, hq + hkv, d), cos, sin)
        ref = torch.cat([qk.reshape(1, -1), ref[:, (hq + hkv) * d:]], dim=1)
        kc, vc, kmin, kmax, kmean, ksum = caches[0]
        fused_append_kv(ref[:, hq * d:(hq + hkv) * d].view(1, hkv, d), ref[:, (hq + hkv) * d:].view(1, hkv, d),
                        kc, vc, kmin, kmax, pos, bs, kmean=kmean, ksum=ksum)
        kc2, vc2, kmin2, kmax2, kmean2, ksum2 = caches[1]
        out = fused_qkv_gemv(x, w, nw, 1e-5, cos, sin, hq, hkv, pos, kc2, vc2, kmin2, kmax2, kmean2, ksum2, bs,
                             out=poisoned(ref))
        assert rel_err(out, ref) < 1e-5
    for a, b in zip(caches[0], caches[1]):
        assert torch.allclose(a.float()[: 6 if a.shape[0] == 12 else None], b.float()[: 6 if b.shape[0] == 12 else None],
                              atol=1e-5, equal_nan=True)
    assert not torch.isnan(caches[1][0][2:6].float()).any()


@pytest.mark.parametrize("bias,norm", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rope_append_matches_reference(bias, norm, cache_dtype):
    """Qwen2's biases / Qwen3's q/k norms + RoPE + the KV append in one decode launch equal the
    PyTorch reference (kernels/attention/naive.py), over steps that open a block, in a ring."""
    from docqa.kernels.attention import naive_rope_append
    from docqa.kernels.attention.triton_kvstore import fused_rope_append
    from docqa.kernels.rope import rope_cos_sin

    hq, hkv, d, bs = 4, 2, 24, 4  # D/2 = 12: not a power of two (masked lanes)
    g = torch.Generator().manual_seed(5)
    b = torch.randn((hq + 2 * hkv) * d, generator=g).to(DEVICE) if bias else None
    qn = (1 + 0.2 * torch.randn(d, generator=g)).to(DEVICE) if norm else None
    kn = (1 + 0.2 * torch.randn(d, generator=g)).to(DEVICE) if norm else None
    caches = [_stale_caches(10, 4, hkv, d, cache_dtype) for _ in range(2)]
    ring = (4, 6)  # positions 4.. wrap in a 6-row ring: 11 -> row 5, 12 -> row 4
    for p in (3, 4, 5, 11, 12):
        qkv = (3 * torch.randn(1, (hq + 2 * hkv) * d, generator=g)).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE, dtype=torch.int32)
        cos, sin = (t.contiguous() for t in rope_cos_sin(pos, d, theta=10000.0))
        ref = naive_rope_append(qkv.clone(), b, qn, kn, 1e-6, cos, sin, hq, hkv, pos, *caches[0], bs, ring=ring)
        out = fused_rope_append(qkv, b, qn, kn, 1e-6, cos, sin, hq, hkv, pos, *caches[1], bs, ring=ring)
        assert out.data_ptr() == qkv.data_ptr() and rel_err(out, ref) < 1e-5
    for a, c in zip(caches[0], caches[1]):
        assert torch.allclose(a.float(), c.float(), atol=1e-5, rtol=1e-2 if cache_dtype == torch.bfloat16 else 1e-5,
                              equal_nan=True)


def test_append_kv_matches_reference_in_a_ring():
    from docqa.kernels.attention import naive_append_kv
    from docqa.kernels.attention.triton_kvstore import fused_append_kv

    hkv, d, bs, ring = 2, 20, 4, (4, 8)
    g = torch.Generator().manual_seed(2)
    states = [[torch.zeros(12, hkv, d, device=DEVICE), torch.zeros(12, hkv, d, device=DEVICE),
               *(torch.randn(6, hkv, d, generator=torch.Generator().manual_seed(1)).to(DEVICE) for _ in range(3)),
               torch.zeros(hkv, d, device=DEVICE)] for _ in range(2)]
    for p in range(0, 22):
        k, v = torch.randn(1, hkv, d, generator=g).to(DEVICE), torch.randn(1, hkv, d, generator=g).to(DEVICE)
        pos = torch.tensor([p], device=DEVICE)
        kc, vc, kmin, kmax, kmean, ksum = states[0]
        naive_append_kv(k, v, kc, vc, kmin, kmax, pos, bs, kmean, ksum, ring)
        kc, vc, kmin, kmax, kmean, ksum = states[1]
        fused_append_kv(k, v, kc, vc, kmin, kmax, pos, bs, kmean=kmean, ksum=ksum, ring=ring)
    for a, c in zip(*states):
        assert torch.allclose(a, c, atol=1e-6)


@pytest.mark.parametrize("staged,splits", [(False, 1), (False, 3), (True, 1)])
def test_sparse_attention_blocks_in_a_far_pool(staged, splits):
    """Tiered KV: a block table whose negative entries put blocks in a second ("host") pool,
    read in place (decode) or staged into a GPU buffer first (prefill, several routing chunks),
    gives the reference attention over the logical keys. Unstaged staging slots are NaN, so
    a read of one would show."""
    from docqa.kernels.attention.naive import naive_sparse_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention, staging_rows

    hq, hkv, d, n, bs, k_sel = 4, 2, 32, 160, 16, 3
    t = 64 if staged else 1
    q, k, v = _qkv(t, hq, hkv, d, n, torch.float32, seed=5)
    nb = n // bs
    g = torch.Generator().manual_seed(7)
    # block 0 (sinks) and the window's blocks on the GPU pool, the others split at random
    far = torch.rand(nb, generator=g) < 0.6
    far[0] = False
    far[(n - t - 24 + 1) // bs:] = False  # every query's window tiles
    n_far = int(far.sum())
    assert 0 < n_far < nb - 4
    gpu_ids = torch.randperm(nb - n_far + 2, generator=g)[: nb - n_far]
    far_ids = torch.randperm(n_far + 1, generator=g)[:n_far]
    table = torch.empty(nb, dtype=torch.int32)
    table[~far] = gpu_ids.int()
    table[far] = (-1 - far_ids).int()
    kp = torch.randn((nb + 2) * bs, hkv, d, generator=g)
    vp = torch.randn_like(kp)
    hk = torch.randn((n_far + 1) * bs, hkv, d, generator=g)
    hv = torch.randn_like(hk)
    ar = torch.arange(bs)
    kc, vc = k.cpu(), v.cpu()
    for b in range(nb):
        pool_k, pool_v, r = (hk, hv, -1 - int(table[b])) if far[b] else (kp, vp, int(table[b]))
        pool_k[r * bs + ar], pool_v[r * bs + ar] = kc[b * bs + ar], vc[b * bs + ar]
    kp, vp, hk, hv, table = (x.to(DEVICE) for x in (kp, vp, hk, hv, table))
    if DEVICE == "cuda":
        hk, hv = hk.cpu().pin_memory(), hv.cpu().pin_memory()
    n_c = 2 if staged else 1
    cand = torch.arange(1, nb - 3)
    idx = torch.stack([torch.stack([cand[torch.randperm(len(cand), generator=g)[:k_sel]] for _ in range(hkv)])
                       for _ in range(n_c)])
    idx[0, 1, -1] = -1  # an unused slot
    assert far[idx[idx >= 0]].any() and (~far[idx[idx >= 0]]).any()
    idx = idx.to(DEVICE)
    staging = None
    if staged:
        rows = staging_rows(n_c, hkv, k_sel, bs)
        staging = (torch.full((rows, hkv, d), float("nan"), device=DEVICE),
                   torch.full((rows, hkv, d), float("nan"), device=DEVICE))
    o, l = fused_sparse_attention(q, kp, vp, n - t, idx, bs, 4, 24, block_table=table, host=(hk, hv),
                                  staging=staging, num_splits=splits, route_chunk=t // n_c if staged else None,
                                  out=poisoned(q))
    for c in range(n_c):
        a, e = c * (t // n_c), (c + 1) * (t // n_c)
        ref_o, ref_l = naive_sparse_attention(q[a:e], k, v, n - t + a, idx[c], bs, 4, 24)
        assert rel_err(o[a:e], ref_o) < ATT_TOL[torch.float32] and rel_err(l[a:e], ref_l) < 1e-3


@pytest.mark.parametrize("start,t", [(40, 24), (70, 30)])
def test_store_and_append_into_a_ring(start, t):
    """A tiered GPU pool: positions past `pin` wrap in a ring of rows. The prefill store and the
    decode append write each key at its ring row, with descriptors per logical block."""
    from docqa.kernels.attention.naive import naive_block_descriptors
    from docqa.kernels.attention.triton_kvstore import fused_append_kv, fused_store_kv_blocks

    hkv, d, bs, pin, ring = 2, 16, 8, 16, 48
    n = start + t
    g = torch.Generator().manual_seed(start)
    keys = torch.randn(n + 1, hkv, d, generator=g).to(DEVICE)
    vals = torch.randn(n + 1, hkv, d, generator=g).to(DEVICE)
    row = lambda p: p if p < pin else pin + (p - pin) % ring
    kc = torch.full((pin + ring, hkv, d), float("nan"), device=DEVICE)
    vc = torch.full_like(kc, float("nan"))
    b0 = start // bs
    for p in range(b0 * bs, start):  # the open block's earlier keys, as an earlier chunk left them
        kc[row(p)], vc[row(p)] = keys[p], vals[p]
    nb = -(-(n + 1) // bs)
    kmin, kmax, kmean = (torch.full((nb, hkv, d), float("nan"), device=DEVICE) for _ in range(3))
    ksum = torch.zeros(hkv, d, device=DEVICE)
    fused_store_kv_blocks(keys[start:n], vals[start:n], kc, vc, kmin, kmax, start, bs, kmean=kmean, ksum=ksum,
                          ring=(pin, ring))
    pos = torch.tensor([n], dtype=torch.int32, device=DEVICE)
    fused_append_kv(keys[n:], vals[n:], kc, vc, kmin, kmax, pos, bs, kmean=kmean, ksum=ksum, ring=(pin, ring))
    for p in range(start, n + 1):
        assert torch.equal(kc[row(p)], keys[p]) and torch.equal(vc[row(p)], vals[p])
    rmin, rmax, rmean = naive_block_descriptors(keys, bs)
    b1 = nb
    assert torch.equal(kmin[b0:b1], rmin[b0:b1]) and torch.equal(kmax[b0:b1], rmax[b0:b1])
    assert torch.allclose(kmean[b0:b1], rmean[b0:b1], atol=1e-5)


@pytest.mark.parametrize("q0,t,chunk,nb_extra", [(40, 48, 16, 0), (300, 40, 16, 3), (5000, 40, 16, 0)])
def test_prefill_routing_folded_into_score_and_topk_kernels(q0, t, chunk, nb_extra):
    """Prefill routing with the candidate mask computed in the block-score kernel (per routing
    chunk, from q0 and the window) and -1 for non-candidate picks from the top-k kernels gives
    the scores and id sets of the torch-masked path (`fused_topk_blocks_unsorted`)."""
    from docqa.kernels.attention.naive import naive_block_descriptors
    from docqa.kernels.attention.triton_block_scores import fused_block_scores
    from docqa.kernels.attention.triton_topk import fused_decode_topk, fused_topk_blocks_unsorted

    hq, hkv, d, bs, window, top_k = 4, 2, 16, 16, 32, 6
    n = q0 + t + nb_extra * bs
    g = torch.Generator().manual_seed(q0 + t)
    keys = torch.randn(n, hkv, d, generator=g).to(DEVICE)
    q = torch.randn(t, hq, d, generator=g).to(DEVICE)
    kmin, kmax, kmean = naive_block_descriptors(keys, bs)
    nb = kmin.shape[0]
    first = 1
    plain = fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk)
    folded = fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk,
                                chunk_candidates=(first, q0, window, bs))
    c = plain.shape[0]
    last = torch.clamp(torch.arange(1, c + 1) * chunk, max=t) - 1 + q0
    end = ((last - window + bs) // bs).clamp_min(0)
    ids = torch.arange(nb)
    for ci in range(c):
        cand = ((ids >= first) & (ids < end[ci])).to(DEVICE)
        assert torch.equal(folded[ci][:, cand], plain[ci][:, cand])
        assert torch.isneginf(folded[ci][:, ~cand]).all()
    ref = fused_topk_blocks_unsorted(plain, top_k, first, end.to(DEVICE)[:, None, None])
    got = fused_decode_topk(folded.view(-1, nb), top_k, drop_noncandidates=True).view(c, hkv, top_k)
    for ci in range(c):
        for h in range(hkv):
            assert sorted(got[ci, h].tolist()) == sorted(ref[ci, h].tolist())
    assert (got == -1).any() or q0 > 200  # the short context leaves slots no candidate fills


@pytest.mark.parametrize("case", [
    # t, hq, hkv, d, n_keys, block, sinks, window, top_k, route_chunk: prefill chunks (no key
    # splits) whose programs see window tiles masked at both edges and whole in between
    (64, 4, 2, 32, 400, 16, 4, 100, 3, 32),
    (40, 2, 1, 48, 330, 16, 20, 70, 4, None),  # D not a power of two, sinks wider than a block
    (64, 4, 2, 16, 64, 16, 4, 24, 2, None),  # from position 0: window tiles reach the sinks
])
def test_prefill_attention_loops_match_reference(case):
    """The three-loop prefill kernel gives the reference result,
    routed blocks inside some queries' windows and -1 slots included, with a block table too."""
    from docqa.kernels.attention.naive import naive_sparse_attention
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k, rc = case
    q, k, v = _qkv(t, hq, hkv, d, n, torch.float32, seed=sum(case[:9]))
    nb = -(-n // bs)
    n_c = -(-t // rc) if rc else 1
    g = torch.Generator().manual_seed(n)
    inside = max(0, (n - window) // bs)  # a block inside the window of the chunk's later queries
    others = torch.tensor([b for b in range(nb) if b != inside])
    idx = torch.stack([torch.stack([others[torch.randperm(nb - 1, generator=g)[:top_k]] for _ in range(hkv)])
                       for _ in range(n_c)]).to(DEVICE)  # routing never picks a block twice
    idx[0, -1, 0] = -1
    idx[-1, 0, 1] = inside
    off = n - t
    perm = torch.randperm(nb + 2, generator=g)[:nb].to(DEVICE)
    kp, vp = (torch.full(((nb + 2) * bs, hkv, d), float("nan"), device=DEVICE) for _ in range(2))
    rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)[:n]
    kp[rows], vp[rows] = k, v
    for table in (None, perm.int()):
        kk, vv = (k, v) if table is None else (kp, vp)
        out = torch.full((t, hq, d), float("nan"), device=DEVICE)
        o, l = fused_sparse_attention(q, kk, vv, off, idx, bs, sinks, window, out=out, num_splits=1,
                                      route_chunk=rc, block_table=table)
        for c in range(n_c):
            a, e = (c * rc, min(t, (c + 1) * rc)) if rc else (0, t)
            ro, rl = naive_sparse_attention(q[a:e], k, v, off + a, idx[c], bs, sinks, window)
            assert rel_err(o[a:e], ro) < ATT_TOL[torch.float32] and rel_err(l[a:e], rl) < 1e-3
