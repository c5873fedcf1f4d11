"""Token-sparse MLA attention kernel (kernels/mla_sparse) against its PyTorch reference, and the
reference against dense causal attention when every earlier token is selected.

On CPU under TRITON_INTERPRET=1 on tiny shapes; on CUDA the same cases run on the GPU."""

from __future__ import annotations

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

pytestmark = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                reason="needs triton and either CUDA or TRITON_INTERPRET=1")

DEVICE = "cuda" if has_cuda() and not interpreting() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def _selection(t, s, k, start, g):
    """Each query's k random earlier-or-same tokens (fewer when it has fewer), -1 padded."""
    rows = []
    for i in range(t):
        visible = start + i + 1
        pick = torch.randperm(visible, generator=g)[:k].tolist()
        rows.append(pick + [-1] * (k - len(pick)))
    return torch.tensor(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, h, r, p, s, k, start", [
    (1, 4, 32, 16, 200, 24, 199),  # decode
    (6, 20, 40, 8, 90, 17, 84),  # chunked prefill: heads past one block, R and P not powers of 2
    (5, 3, 64, 16, 40, 64, 0),  # first chunk: rows with fewer tokens than k (-1 padding)
])
def test_mla_sparse_attention(t, h, r, p, s, k, start, dtype):
    from docqa.kernels.mla_sparse import fused_mla_sparse_attention, naive_mla_sparse_attention

    g = torch.Generator().manual_seed(t * 100 + h)
    q = torch.randn(t, h, r + p, generator=g).to(dtype)
    lat = torch.randn(s, r + p, generator=g).to(dtype)
    idx = _selection(t, s, k, start, g)
    want = naive_mla_sparse_attention(q.float(), lat.float(), idx, r, (r + p) ** -0.5)
    got = fused_mla_sparse_attention(q.to(DEVICE), lat.to(DEVICE), idx.to(DEVICE), r,
                                     (r + p) ** -0.5).cpu()
    assert got.dtype == dtype
    assert rel_err(got.float(), want) < TOL[dtype]


def test_reference_equals_dense_when_everything_is_selected():
    """All earlier tokens selected (in scrambled order): the causal dense result."""
    from docqa.kernels.mla_sparse import naive_mla_sparse_attention

    g = torch.Generator().manual_seed(0)
    t, h, r, p, start = 7, 4, 24, 8, 20
    q, lat = torch.randn(t, h, r + p, generator=g), torch.randn(start + t, r + p, generator=g)
    idx = torch.stack([torch.cat((torch.randperm(start + i + 1, generator=g),
                                  torch.full((t - 1 - i,), -1))) for i in range(t)])
    got = naive_mla_sparse_attention(q, lat, idx, r, 0.3)
    scores = torch.einsum("thd,sd->hts", q, lat) * 0.3
    causal = torch.arange(start + t)[None, :] <= torch.arange(start, start + t)[:, None]
    dense = torch.einsum("hts,sr->thr", scores.masked_fill(~causal, float("-inf")).softmax(-1),
                         lat[:, :r])
    assert rel_err(got, dense) < 1e-6


def test_row_with_nothing_selected_is_zero():
    from docqa.kernels.mla_sparse import fused_mla_sparse_attention

    q, lat = torch.randn(2, 4, 48), torch.randn(10, 48)
    idx = torch.tensor([[3, 5, -1], [-1, -1, -1]])
    got = fused_mla_sparse_attention(q.to(DEVICE), lat.to(DEVICE), idx.to(DEVICE), 32, 0.2).cpu()
    assert torch.equal(got[1], torch.zeros(4, 32)) and got[0].abs().sum() > 0


# --- routed (block-sparse) attention on the latent: sinks + top-k blocks + window --------------

def _dense_causal(q, lat, q0, r, scale):
    """Plain causal softmax attention of q [T, H, W] at q0.. over lat [S, W] (values lat[:, :r])."""
    t = q.shape[0]
    s = torch.einsum("thd,sd->ths", q.double(), lat.double()) * scale
    causal = torch.arange(lat.shape[0])[None, :] <= torch.arange(q0, q0 + t)[:, None]
    return torch.einsum("ths,sr->thr", s.masked_fill(~causal[:, None], float("-inf")).softmax(-1),
                        lat[:, :r].double())


def _cache(lat: torch.Tensor) -> torch.Tensor:
    """lat [S, W] on the device as the first S rows of a larger buffer whose other rows are NaN,
    as a cache's unstored rows may hold anything: a kernel that reads past the stored rows (the
    rest of a partial last block) shows it in its output."""
    buf = torch.full((lat.shape[0] + 64, lat.shape[1]), float("nan"), dtype=lat.dtype)
    buf[:lat.shape[0]] = lat
    return buf.to(DEVICE)[:lat.shape[0]]


def test_latent_descriptors_prefill_and_decode_append():
    """Descriptors kept by chunked prefill (a partial block continued) and by decode appends equal
    min / max / mean over each block's rows, computed from scratch."""
    from docqa.kernels.mla_sparse import fused_latent_append, naive_latent_descriptors, store_latent_descriptors

    g = torch.Generator().manual_seed(3)
    cap, w, b = 64, 40, 16
    rows = torch.randn(cap, w, generator=g)
    lat = torch.full((cap, w), 7.0, device=DEVICE)  # stale rows past the end must not count
    d = [torch.zeros(cap // b, w, device=DEVICE) for _ in range(3)]
    for a, e in ((0, 21), (21, 37)):
        lat[a:e] = rows[a:e].to(DEVICE)
        store_latent_descriptors(lat, *d, a, e, b)
    for p in range(37, 50):
        fused_latent_append(rows[p:p + 1].to(DEVICE), lat, *d, torch.tensor([p], dtype=torch.int32, device=DEVICE), b)
    want = naive_latent_descriptors(rows[:50], b)
    for got, ref in zip(d, want):
        assert torch.allclose(got[:4].cpu(), ref, atol=1e-6)
    assert torch.equal(lat[:50].cpu(), rows[:50])


@pytest.mark.parametrize("method", ["mean", "minmax"])
def test_mla_block_scores(method):
    """Per routing chunk: max over its queries and heads, -inf outside its candidates; and one
    decode query with the candidates' end on the device."""
    from docqa.kernels.mla_sparse import fused_mla_block_scores, naive_latent_descriptors, naive_mla_block_scores

    g = torch.Generator().manual_seed(11)
    t, h, r, p, b, q0, win = 21, 5, 40, 8, 8, 60, 12
    lat = torch.randn(q0 + t, r + p, generator=g)
    q = torch.randn(t, h, r + p, generator=g)
    desc = naive_latent_descriptors(lat, b)
    want = naive_mla_block_scores(q, *desc, method, 8, q0, 1, win, b)
    got = fused_mla_block_scores(q.to(DEVICE), *[x.to(DEVICE) for x in desc], method, 8, q0, 1, win, b).cpu()
    assert got.shape == want.shape == (3, desc[0].shape[0])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert fin.sum() > 10 and torch.allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)
    # decode: candidates first .. end-1 with end = first block the window of position 70 covers
    end = torch.tensor([(70 - win + b) // b], device=DEVICE)
    got = fused_mla_block_scores(q[:1].to(DEVICE), *[x.to(DEVICE) for x in desc], method, 1, 70, 1, win, b,
                                 end=end).cpu()
    want = naive_mla_block_scores(q[:1], *desc, method, 1, 70, 1, win, b)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.allclose(got[fin], want[fin], atol=1e-5)


def _random_blocks(n_c, k, nb, g):
    rows = [torch.randperm(nb, generator=g)[:k] for _ in range(n_c)]
    blocks = torch.stack(rows)
    blocks[0, -1] = -1  # a chunk with a free slot
    return blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, h, r, p, q0, chunk, b, sinks, win", [
    (19, 5, 40, 8, 70, 8, 8, 3, 12),  # chunks of 8 queries, a ragged last one; blocks overlap windows
    (6, 20, 32, 16, 100, 16, 16, 20, 16),  # sinks past a block, 20 heads: rows of a program span queries
])
def test_mla_routed_attention_matches_reference(t, h, r, p, q0, chunk, b, sinks, win, dtype):
    from docqa.kernels.mla_sparse import fused_mla_routed_attention, naive_mla_routed_attention

    g = torch.Generator().manual_seed(t + h)
    lat = torch.randn(q0 + t + 5, r + p, generator=g).to(dtype)  # rows past the chunk are never read
    q = torch.randn(t, h, r + p, generator=g).to(dtype)
    nb = -(-(q0 + t) // b)
    blocks = _random_blocks(-(-t // chunk), 3, nb, g)
    scale = (r + p) ** -0.5
    want = naive_mla_routed_attention(q.float(), lat.float(), q0, blocks, chunk, b, sinks, win, r, scale)
    got = fused_mla_routed_attention(q.to(DEVICE), _cache(lat), q0, blocks.to(DEVICE), chunk, b, sinks, win, r,
                                     scale).cpu()
    assert got.dtype == dtype
    assert rel_err(got.float(), want) < TOL[dtype]


def test_mla_routed_attention_with_every_candidate_is_dense():
    """Every block selected: exact causal attention (reference and kernel), though each key comes
    from one of three sets (sinks, blocks, window) and blocks overlap sinks and windows; the last
    block is partial, the rows after the stored ones NaN (read, they once gave NaN outputs)."""
    from docqa.kernels.mla_sparse import fused_mla_routed_attention, naive_mla_routed_attention

    g = torch.Generator().manual_seed(1)
    t, h, r, p, q0, chunk, b, sinks, win = 13, 4, 24, 8, 40, 5, 8, 3, 9
    lat, q = torch.randn(q0 + t, r + p, generator=g), torch.randn(t, h, r + p, generator=g)
    nb = -(-(q0 + t) // b)
    blocks = torch.arange(nb).expand(-(-t // chunk), -1)
    want = _dense_causal(q, lat, q0, r, 0.3)
    assert rel_err(naive_mla_routed_attention(q, lat, q0, blocks, chunk, b, sinks, win, r, 0.3), want) < 1e-6
    got = fused_mla_routed_attention(q.to(DEVICE), _cache(lat), q0, blocks.to(DEVICE), chunk, b, sinks, win, r, 0.3)
    assert rel_err(got.cpu(), want) < 1e-5


def _gpu_only_bf16():
    # bf16 on the GPU only: the kernel's bf16 dots are tensor-core dots, which the interpreter does not emulate
    return [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        DEVICE == "cpu", reason="bf16 tensor-core dots need the GPU"))]


# under the interpreter ~5-17 s a tile: by default only the 64-row, 32-key one (rows of 3.2 queries)
@pytest.mark.parametrize("dtype", _gpu_only_bf16())
@pytest.mark.parametrize("tile", [pytest.param(i, marks=[] if i == 2 or DEVICE == "cuda" else [pytest.mark.slow])
                                  for i in range(3)])
def test_mla_routed_attention_at_the_real_head_dims_with_every_gpu_tile(tile, dtype):
    """GLM-4.7-Flash's attention dims (R = 512, P = 64, 20 heads: a program's rows span several
    queries) under each of the GPU's autotune configs, forced (the interpreter's autotuner has
    only its own): every block selected (in scrambled order, -1 slots between) is dense causal
    attention, and a few selected blocks are the reference's. Queries start inside a block and
    off a routing-chunk boundary, as a prefill call after a cached prefix does."""
    from docqa.kernels.mla_sparse import fused_mla_routed_attention, naive_mla_routed_attention
    from docqa.kernels.mla_sparse.triton_mla_routed import ATTN_TILES

    g = torch.Generator().manual_seed(40 + tile)
    t, h, r, p, q0, chunk, b, sinks, win = 10, 20, 512, 64, 131, 4, 16, 4, 24
    lat = torch.randn(q0 + t, r + p, generator=g)
    q = torch.randn(t, h, r + p, generator=g) * 0.1
    nb, n_c = -(-(q0 + t) // b), -(-t // chunk)
    every = torch.stack([torch.cat((torch.randperm(nb, generator=g), torch.tensor([-1, -1])))[
        torch.randperm(nb + 2, generator=g)] for _ in range(n_c)])
    some = _random_blocks(n_c, 3, nb, g)
    scale = (192 + p) ** -0.5
    for blocks, want in ((every, _dense_causal(q, lat, q0, r, scale)),
                         (some, naive_mla_routed_attention(q, lat, q0, some, chunk, b, sinks, win, r, scale))):
        got = fused_mla_routed_attention(q.to(DEVICE, dtype), _cache(lat.to(dtype)), q0, blocks.to(DEVICE), chunk, b,
                                         sinks, win, r, scale, tile=ATTN_TILES[tile]).cpu()
        assert rel_err(got.float(), want.float()) < TOL[dtype] * (10 if dtype == torch.float32 else 1)


# --- the same attention on keys and values expanded per head (long prefill calls) --------------

def _expanded_inputs(t, h, n, v, r, p, q0, g):
    """Queries in both forms: q_nope [T, H, N], q_rot [T, H, P], kv_b_proj per head w_kv
    [H, N + V, R], and the absorbed query [q_nope W_UK | q_rot] the latent kernels read."""
    q_nope = torch.randn(t, h, n, generator=g)
    q_rot = torch.randn(t, h, p, generator=g)
    w_kv = torch.randn(h, n + v, r, generator=g) * r ** -0.5
    q_abs = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_kv[:, :n]), q_rot), dim=-1)
    lat = torch.randn(q0 + t, r + p, generator=g)
    return q_nope, q_rot, w_kv, q_abs, lat


def test_expanded_reference_equals_absorbed_reference_after_w_uv():
    """The two forms of MLA are one attention: keys [c W_UK^T | k_rot] and values c W_UV^T per
    head against the absorbed query on the latent, its output then multiplied by W_UV^T."""
    from docqa.kernels.mla_sparse import naive_mla_routed_attention, naive_mla_routed_attention_expanded

    g = torch.Generator().manual_seed(3)
    t, h, n, v, r, p, q0, chunk, b, sinks, win = 11, 3, 24, 20, 32, 16, 50, 4, 8, 3, 10
    q_nope, q_rot, w_kv, q_abs, lat = _expanded_inputs(t, h, n, v, r, p, q0, g)
    blocks = _random_blocks(-(-t // chunk), 2, -(-(q0 + t) // b), g)
    scale = (n + p) ** -0.5
    absorbed = naive_mla_routed_attention(q_abs.double(), lat.double(), q0, blocks, chunk, b, sinks, win, r, scale)
    want = torch.einsum("thr,hvr->thv", absorbed, w_kv[:, n:].double())
    got = naive_mla_routed_attention_expanded(q_nope.double(), q_rot.double(), lat.double(), w_kv.double(), q0,
                                              blocks, chunk, b, sinks, win, scale)
    assert rel_err(got, want) < 1e-6  # both references compute in fp32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, h, n, v, r, p, q0, chunk, b, sinks, win", [
    (19, 5, 24, 20, 40, 8, 70, 8, 8, 3, 12),  # N = 16 + 8 (a masked remainder), ragged last chunk
    (37, 4, 32, 16, 32, 16, 100, 16, 16, 20, 16),  # N a power of two, sinks past a block, 3 query tiles
    (6, 3, 16, 16, 16, 16, 2, 4, 4, 4, 8),  # the first call: fewer keys than sinks, window before 0
])
def test_mla_routed_attention_expanded_matches_reference(t, h, n, v, r, p, q0, chunk, b, sinks, win, dtype):
    from docqa.kernels.mla_sparse import fused_mla_routed_attention_expanded, naive_mla_routed_attention_expanded

    g = torch.Generator().manual_seed(t + h)
    q_nope, q_rot, w_kv, _, lat = _expanded_inputs(t, h, n, v, r, p, q0, g)
    nb = -(-(q0 + t) // b)
    blocks = _random_blocks(-(-t // chunk), 3, nb, g) if nb >= 3 else torch.full((-(-t // chunk), 1), -1)
    scale = (n + p) ** -0.5
    want = naive_mla_routed_attention_expanded(q_nope, q_rot, lat.to(dtype).float(), w_kv.to(dtype).float(), q0,
                                               blocks, chunk, b, sinks, win, scale)
    # q_nope as the decoder passes it: a strided view of a wider projection
    wide = torch.cat((q_nope, q_rot), dim=-1).to(DEVICE, dtype)
    got = fused_mla_routed_attention_expanded(wide[..., :n], q_rot.to(DEVICE, dtype), _cache(lat.to(dtype)),
                                              w_kv.to(DEVICE, dtype), q0, blocks.to(DEVICE), chunk, b, sinks, win,
                                              scale).cpu()
    assert got.dtype == dtype
    assert rel_err(got.float(), want) < TOL[dtype] * (2 if dtype == torch.bfloat16 else 1)


@pytest.mark.parametrize("dtype", _gpu_only_bf16())
@pytest.mark.parametrize("tile", [pytest.param(i, marks=[] if i == 0 or DEVICE == "cuda" else [pytest.mark.slow])
                                  for i in range(4)])
def test_mla_routed_attention_expanded_at_the_real_head_dims_with_every_gpu_tile(tile, dtype):
    """GLM-4.7-Flash's dims (N 192 = 128 + 64, V 256, P 64, R 512; 20 heads on a GPU, 4 under
    the interpreter: heads are separate programs) under each GPU config, forced: every block
    selected is dense causal attention of the expanded form, a few are the reference's; queries
    start mid-block and off a routing-chunk boundary, the last routing chunk ragged."""
    from docqa.kernels.mla_sparse import fused_mla_routed_attention_expanded, naive_mla_routed_attention_expanded
    from docqa.kernels.mla_sparse.triton_mla_routed import EXP_TILES

    g = torch.Generator().manual_seed(60 + tile)
    h = 20 if DEVICE == "cuda" else 4
    t, n, v, r, p, q0, chunk, b, sinks, win = 40, 192, 256, 512, 64, 131, 16, 16, 4, 24
    q_nope, q_rot, w_kv, _, lat = _expanded_inputs(t, h, n, v, r, p, q0, g)
    nb, n_c = -(-(q0 + t) // b), -(-t // chunk)
    every = torch.stack([torch.cat((torch.randperm(nb, generator=g), torch.tensor([-1, -1])))[
        torch.randperm(nb + 2, generator=g)] for _ in range(n_c)])
    some = _random_blocks(n_c, 3, nb, g)
    scale = (n + p) ** -0.5
    full = torch.arange(nb).expand(n_c, -1)
    for blocks, ref_blocks in ((every, full), (some, some)):
        want = naive_mla_routed_attention_expanded(q_nope, q_rot, lat, w_kv, q0, ref_blocks, chunk, b, sinks, win,
                                                   scale)
        got = fused_mla_routed_attention_expanded(q_nope.to(DEVICE, dtype), q_rot.to(DEVICE, dtype),
                                                  _cache(lat.to(dtype)), w_kv.to(DEVICE, dtype), q0,
                                                  blocks.to(DEVICE), chunk, b, sinks, win, scale,
                                                  tile=EXP_TILES[tile]).cpu()
        assert rel_err(got.float(), want) < TOL[dtype] * (10 if dtype == torch.float32 else 2)


@pytest.mark.parametrize("dtype", _gpu_only_bf16())
@pytest.mark.parametrize("pos", [2, 30, 150])
def test_mla_routed_decode_matches_reference(pos, dtype):
    """kernels/mla_decode's split-K kernel over sinks + routed blocks + window (one query at pos;
    early positions: window before 0, blocks inside the window or past pos), as the reference."""
    from docqa.kernels.mla_decode import fused_mla_decode
    from docqa.kernels.mla_sparse import naive_mla_routed_attention

    g = torch.Generator().manual_seed(pos)
    h, r, p, b, sinks, win = 20, 32, 16, 16, 4, 24
    lat = torch.randn(176, r + p, generator=g).to(dtype)
    q = torch.randn(1, h, r + p, generator=g).to(dtype)
    blocks = torch.tensor([[9, 0, -1, 3, 1]])
    want = naive_mla_routed_attention(q.float(), lat.float(), pos, blocks, 1, b, sinks, win, r, 0.2)
    n = torch.tensor([pos + 1], dtype=torch.int32, device=DEVICE)
    for splits in (None, 3):
        got = fused_mla_decode(q.to(DEVICE), lat.to(DEVICE), n, r, 0.2, routed=(blocks.to(DEVICE), sinks, win, b),
                               splits=splits).cpu()
        assert rel_err(got.float(), want) < TOL[dtype]
