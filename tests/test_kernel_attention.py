"""Attention: the references against direct fp64 softmax attention, and
`fused_sparse_attention` / `fused_attention` against `naive_sparse_attention` /
`naive_attention` (kernels/attention), decode and prefill, paged and tiered pools included."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_check import ATT_TOL, DEVICE, LSE_TOL, REAL_SHAPES, assert_close, needs_triton, poisoned, qkv

from docqa.kernels.attention import (
    merge_attention,
    naive_attention,
    naive_block_descriptors,
    naive_sparse_attention,
)

# --- the references against fp64 ------------------------------------------------------------

SHAPES = [  # (T, q_offset, Hq, Hkv, D)
    (63, 0, 6, 2, 60),  # GQA 3:1, odd T, D=60
    (500, 0, 4, 1, 64),  # GQA 4:1
    (37, 100, 8, 2, 64),  # a chunk after a prefix
    (1, 211, 3, 1, 60),  # decode
]


def data(t, off, hq, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = off + t
    return (torch.randn(t, hq, d, generator=g), torch.randn(n, hkv, d, generator=g),
            torch.randn(n, hkv, d, generator=g))


def ref_attention(q, k, v, q_offset, allowed=None):
    """Direct fp64 softmax attention; allowed: bool [Hkv, T, N] restricting the causal keys."""
    t, hq, d = q.shape
    n, hkv = k.shape[:2]
    g = hq // hkv
    i = torch.arange(q_offset, q_offset + t)[:, None]
    causal = torch.arange(n)[None, :] <= i
    out = torch.zeros(t, hq, d, dtype=torch.float64)
    lse = torch.zeros(t, hq, dtype=torch.float64)
    for h in range(hq):
        kv = h // g
        s = q[:, h].double() @ k[:, kv].double().T / math.sqrt(d)  # [T, N]
        keep = causal if allowed is None else causal & allowed[kv]
        s = s.masked_fill(~keep, -math.inf)
        lse[:, h] = torch.logsumexp(s, 1)
        out[:, h] = torch.softmax(s, 1) @ v[:, kv].double()
    return out, lse


def allowed_mask(hkv, q_offset, t, n, rule):
    """bool [Hkv, T, N] from a per-element rule(kv, i, j) written as plain Python."""
    return torch.tensor([[[rule(kv, q_offset + ti, j) for j in range(n)] for ti in range(t)]
                         for kv in range(hkv)])


@pytest.mark.parametrize("shape", SHAPES)
def test_dense_attention_matches_fp64(shape):
    t, off, hq, hkv, d = shape
    q, k, v = data(*shape)
    out, lse = naive_attention(q, k, v, off)
    ref, ref_lse = ref_attention(q, k, v, off)
    assert_close(out, ref, 1e-5)
    assert_close(lse, ref_lse, 1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_attention_matches_fp64_masked(shape):
    t, off, hq, hkv, d = shape
    q, k, v = data(*shape, seed=3)
    n, block, sinks, window = off + t, 16, 4, 24
    nb = -(-n // block)
    gen = torch.Generator().manual_seed(4)
    block_idx = torch.stack([torch.randperm(nb, generator=gen)[: min(3, nb)].sort().values for _ in range(hkv)])
    block_idx[0, -1] = -1  # an unused slot
    chosen = [set(x for x in row.tolist() if x >= 0) for row in block_idx]

    def allowed(kv, i, j):
        return j < sinks or j > i - window or j // block in chosen[kv]

    out, lse = naive_sparse_attention(q, k, v, off, block_idx, block, sinks, window)
    ref, ref_lse = ref_attention(q, k, v, off, allowed_mask(hkv, off, t, n, allowed))
    assert_close(out, ref, 1e-5)
    assert_close(lse, ref_lse, 1e-5)


def test_sparse_attention_with_every_block_equals_dense():
    q, k, v = data(40, 300, 6, 2, 64, seed=5)
    nb = -(-340 // 32)
    every = torch.arange(nb).expand(2, nb)
    out, lse = naive_sparse_attention(q, k, v, 300, every, 32, 4, 64)
    ref, ref_lse = ref_attention(q, k, v, 300)
    assert_close(out, ref, 1e-5)
    assert_close(lse, ref_lse, 1e-5)


def test_merge_of_disjoint_parts_equals_whole():
    q, k, v = data(7, 93, 4, 2, 60, seed=6)
    i0 = 93

    first = torch.arange(100)[None, None, :].expand(2, 7, 100) < 50
    o1, l1 = ref_attention(q, k, v, i0, first)
    o2, l2 = ref_attention(q, k, v, i0, ~first)
    out, lse = merge_attention(o1.float(), l1.float(), o2.float(), l2.float())
    ref, ref_lse = ref_attention(q, k, v, i0)
    assert_close(out, ref, 1e-5)
    assert_close(lse, ref_lse, 1e-6)
    # An empty part (lse -inf) contributes nothing and makes no NaN.
    empty = torch.full_like(l1.float(), -math.inf)
    out, lse = merge_attention(torch.zeros_like(o1.float()), empty, ref.float(), ref_lse.float())
    assert_close(out, ref, 1e-6)


def test_bad_shapes_are_rejected():
    q, k, v = data(4, 0, 5, 2, 16)
    with pytest.raises(ValueError):
        naive_attention(q, k, v, 0)  # 5 query heads over 2 kv heads
    q, k, v = data(4, 0, 4, 2, 16)
    with pytest.raises(ValueError):
        naive_attention(q, k, v, 1)  # queries beyond the keys


def test_sparse_reference_pools_and_routing_chunks():
    """The reference's kernel-shaped arguments: a paged pool with far (host) blocks through a
    block table, and one selection per routing chunk, equal plain calls on the logical keys."""
    t, hq, hkv, d, n, bs = 12, 4, 2, 16, 96, 16
    q, k, v = data(t, n - t, hq, hkv, d, seed=8)
    nb = n // bs
    table = torch.tensor([3, -1, 0, -3, 2, 5])  # blocks 1 and 3 in the host pool, rows 0 and 2
    kp, vp = torch.full((6 * bs, hkv, d), float("nan")), torch.full((6 * bs, hkv, d), float("nan"))
    hk, hv = torch.full((3 * bs, hkv, d), float("nan")), torch.full((3 * bs, hkv, d), float("nan"))
    for b in range(nb):
        pk, pv, r = (kp, vp, int(table[b])) if table[b] >= 0 else (hk, hv, -1 - int(table[b]))
        pk[r * bs:(r + 1) * bs], pv[r * bs:(r + 1) * bs] = k[b * bs:(b + 1) * bs], v[b * bs:(b + 1) * bs]
    idx = torch.tensor([[[1, 3], [0, -1]], [[2, 4], [3, 1]]])  # two routing chunks of 8 and 4 queries
    out, lse = torch.full((t, hq, d), float("nan")), torch.full((t, hq), float("nan"))
    o, l = naive_sparse_attention(q, kp, vp, torch.tensor([n - t]), idx, bs, 2, 20, block_table=table,
                                  host=(hk, hv), route_chunk=8, out=out, lse=lse, num_splits=3)
    assert o is out and l is lse
    for c, (a, e) in enumerate([(0, 8), (8, 12)]):
        ro, rl = naive_sparse_attention(q[a:e], k, v, n - t + a, idx[c], bs, 2, 20)
        assert torch.equal(o[a:e], ro) and torch.equal(l[a:e], rl)
    with pytest.raises(ValueError, match="routing chunks"):
        naive_sparse_attention(q, k, v, n - t, idx, bs, 2, 20, route_chunk=4)


# --- the kernels against the references ----------------------------------------------------

SPARSE_CASES = [
    # t, hq, hkv, d, n_keys, block, sinks, window, top_k
    (1, 4, 2, 60, 200, 16, 3, 24, 3),  # decode: split-KV path, D=60
    (9, 4, 1, 32, 150, 16, 4, 20, 2),  # a prefill chunk at the end of the keys
    (63, 2, 2, 16, 63, 16, 0, 8, 1),  # chunk from position 0, no sinks
]


@needs_triton
@pytest.mark.parametrize("case", SPARSE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_attention(case, dtype):
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k = case
    q, k, v = qkv(t, hq, hkv, d, n, dtype, seed=sum(case))
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
        assert_close(o, ref_o, ATT_TOL[dtype])
        assert_close(l, ref_l, 1e-3)


@needs_triton
@pytest.mark.parametrize("splits", [1, 3])
def test_sparse_attention_paged_pool_and_splits(splits):
    """Keys stored in a shuffled page pool through a block table give the same result."""
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs = 2, 4, 2, 32, 96, 16
    q, k, v = qkv(t, hq, hkv, d, n, torch.float32, seed=3)
    nb = n // bs
    perm = torch.randperm(nb + 2, generator=torch.Generator().manual_seed(1))[:nb].to(DEVICE)
    kp = torch.randn((nb + 2) * bs, hkv, d, device=DEVICE)
    vp = torch.randn((nb + 2) * bs, hkv, d, device=DEVICE)
    rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)
    kp[rows], vp[rows] = k, v
    idx = torch.tensor([[0, 2], [1, -1]], device=DEVICE)
    ref_o, ref_l = naive_sparse_attention(q, k, v, n - t, idx, bs, 2, 20)
    o, l = fused_sparse_attention(q, kp, vp, n - t, idx, bs, 2, 20, block_table=perm.int(), num_splits=splits)
    assert_close(o, ref_o, ATT_TOL[torch.float32])
    assert_close(l, ref_l, 1e-3)


@needs_triton
def test_dense_equals_reference():
    from docqa.kernels.attention.triton_sparse_attention import fused_attention

    q, k, v = qkv(5, 4, 2, 32, 40, torch.float32, seed=11)
    ref_o, ref_l = naive_attention(q, k, v, 30)
    o, l = fused_attention(q, k, v, 30)
    assert_close(o, ref_o, ATT_TOL[torch.float32])
    assert_close(l, ref_l, 1e-3)


@needs_triton
@pytest.mark.parametrize("hq", [8, 6])  # GQA groups of 4 and of 3 (SmolLM2's: no power-of-two tile)
def test_routing_chunks_in_one_launch(hq):
    """[C, Hkv, K] selections (one per routing chunk) equal C separate reference calls."""
    from docqa.kernels.attention.triton_block_scores import fused_block_scores
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hkv, d, n, bs, chunk = 32, 2, 32, 160, 16, 16
    q, k, v = qkv(t, hq, hkv, d, n, torch.float32, seed=5)
    kmin, kmax, kmean = naive_block_descriptors(k, bs)
    per_chunk = fused_block_scores(q, kmin, kmax, kmean, "minmax", chunk=chunk)
    assert per_chunk.shape == (2, hkv, n // bs)
    assert_close(per_chunk[1], fused_block_scores(q[chunk:], kmin, kmax, kmean), 1e-5)
    idx = torch.tensor([[[0, 3], [2, -1]], [[5, 1], [4, 6]]], device=DEVICE)
    o, l = fused_sparse_attention(q, k, v, n - t, idx, bs, 2, 24)
    for c in range(2):
        sl = slice(c * chunk, (c + 1) * chunk)
        ro, rl = naive_sparse_attention(q[sl], k, v, n - t + c * chunk, idx[c], bs, 2, 24)
        assert_close(o[sl], ro, ATT_TOL[torch.float32])
        assert_close(l[sl], rl, 1e-3)


@needs_triton
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
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k = case
    q, k, v = qkv(t, hq, hkv, d, n, torch.float32, seed=sum(case))
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
        assert_close(o, ref_o, ATT_TOL[torch.float32])
        assert_close(l, ref_l, 1e-3)
    perm = torch.randperm(nb + 1, generator=g)[:nb].to(DEVICE)
    kp = torch.randn((nb + 1) * bs, hkv, d, device=DEVICE)
    vp = torch.randn((nb + 1) * bs, hkv, d, device=DEVICE)
    kpad = torch.cat([k, k.new_zeros(nb * bs - n, hkv, d)])
    vpad = torch.cat([v, v.new_zeros(nb * bs - n, hkv, d)])
    rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)
    kp[rows], vp[rows] = kpad, vpad
    o, l = fused_sparse_attention(q, kp, vp, off, idx, bs, sinks, window, block_table=perm.int())
    assert_close(o, ref_o, ATT_TOL[torch.float32])
    assert_close(l, ref_l, 1e-3)


@needs_triton
@pytest.mark.parametrize("staged,splits", [(False, 1), (False, 3), (True, 1)])
def test_sparse_attention_blocks_in_a_far_pool(staged, splits):
    """Tiered KV: a block table whose negative entries put blocks in a second ("host") pool,
    read in place (decode) or staged into a GPU buffer first (prefill, several routing chunks),
    gives the reference attention over the logical keys. Unstaged staging slots are NaN, so
    a read of one would show."""
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention, staging_rows

    hq, hkv, d, n, bs, k_sel = 4, 2, 32, 160, 16, 3
    t = 64 if staged else 1
    q, k, v = qkv(t, hq, hkv, d, n, torch.float32, seed=5)
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
        assert_close(o[a:e], ref_o, ATT_TOL[torch.float32])
        assert_close(l[a:e], ref_l, 1e-3)


@needs_triton
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
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    t, hq, hkv, d, n, bs, sinks, window, top_k, rc = case
    q, k, v = qkv(t, hq, hkv, d, n, torch.float32, seed=sum(case[:9]))
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
            assert_close(o[a:e], ro, ATT_TOL[torch.float32])
            assert_close(l[a:e], rl, 1e-3)



@needs_triton
@pytest.mark.parametrize("t", [1, 40])
@pytest.mark.parametrize("d,group", REAL_SHAPES)
def test_sparse_attention_real_shapes(d, group, t):
    """Blocks of 64 keys, head dims 64 / 128, GQA groups 1-8: a decode step (split-KV, the
    position from a device tensor) and a prefill chunk of three routing chunks through a paged
    pool, against the reference called with the same arguments."""
    from docqa.kernels.attention.triton_sparse_attention import fused_sparse_attention

    hkv, n, bs, sinks, window, top_k = 2, 640, 64, 4, 128, 2
    q, k, v = qkv(t, group * hkv, hkv, d, n, seed=d * 10 + group + t)
    nb = n // bs
    g = torch.Generator().manual_seed(d + group)
    n_c = 1 if t == 1 else 3
    idx = torch.stack([torch.stack([1 + torch.randperm(nb - 4, generator=g)[:top_k] for _ in range(hkv)])
                       for _ in range(n_c)]).to(DEVICE)
    idx[0, -1, 0] = -1  # an unused slot
    off = torch.tensor([n - t], device=DEVICE) if t == 1 else n - t
    kw = {}
    if t > 1:  # a shuffled paged pool, NaN where no block lives
        perm = torch.randperm(nb + 2, generator=g)[:nb].to(DEVICE)
        kp, vp = (torch.full(((nb + 2) * bs, hkv, d), float("nan"), device=DEVICE) for _ in range(2))
        rows = (perm[:, None] * bs + torch.arange(bs, device=DEVICE)).reshape(-1)
        kp[rows], vp[rows] = k, v
        k, v = kp, vp
        kw = dict(block_table=perm.int(), route_chunk=16)
    o, l = fused_sparse_attention(q, k, v, off, idx, bs, sinks, window, out=poisoned(q), **kw)
    ro, rl = naive_sparse_attention(q, k, v, off, idx if t > 1 else idx[0], bs, sinks, window, **kw)
    assert_close(o, ro, ATT_TOL[torch.float32], "out")
    assert_close(l, rl, LSE_TOL, "lse")
