"""Paged attention of many sequences at once: `naive_paged_attention` against direct fp64
softmax attention of each sequence alone, and `fused_paged_attention` (one launch for the
batch) against the reference on awkward batches — ragged lengths, chunks that start mid-block
after cached tokens, one-token and many-token parts mixed, GQA groups, D=60, key splits — over a
shuffled pool whose unwritten rows are NaN."""

from __future__ import annotations

import math

import pytest
import torch

from kernel_check import ATT_TOL, DEVICE, REAL_SHAPES, assert_close, needs_triton

from docqa.kernels.attention import naive_paged_attention


def paged_batch(parts, hq, hkv, d, bs, dtype=torch.float32, seed=0):
    """parts [(cached, new)]: sequence s holds cached + new tokens, its last `new` are this
    batch's queries. Returns q, the pool k/v (NaN where no key was written), cu_seqlens_q,
    seq_lens, block_tables (wider than needed, padded with a block of NaN) and each sequence's
    keys in logical order."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-(c + n) // bs) for c, n in parts]
    n_blocks = sum(need) + 3
    perm = torch.randperm(n_blocks, generator=g)
    k = torch.full((n_blocks * bs, hkv, d), float("nan"))
    v = torch.full_like(k, float("nan"))
    tables = torch.full((len(parts), max(need) + 2), int(perm[-1]), dtype=torch.int32)
    keys, used = [], 0
    for s, (c, n) in enumerate(parts):
        ks, vs = torch.randn(c + n, hkv, d, generator=g), torch.randn(c + n, hkv, d, generator=g)
        blocks = perm[used:used + need[s]]
        used += need[s]
        tables[s, :need[s]] = blocks
        rows = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[:c + n]
        k[rows], v[rows] = ks, vs
        keys.append((ks, vs))
    new = torch.tensor([n for _, n in parts])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), new.cumsum(0)]).to(torch.int32)
    lens = torch.tensor([c + n for c, n in parts], dtype=torch.int32)
    q = torch.randn(int(new.sum()), hq, d, generator=g)
    on = lambda x: x.to(DEVICE, dtype)
    return (on(q), on(k), on(v), cu.to(DEVICE), lens.to(DEVICE), tables.to(DEVICE),
            [(on(a), on(b)) for a, b in keys])


def direct(q, k, v, q_offset):
    """fp64 softmax attention of one sequence's queries at q_offset.. over its keys k, v [N, Hkv, D]."""
    t, hq, d = q.shape
    g = hq // k.shape[1]
    s = torch.einsum("thd,nhd->htn", q.double(), k.double().repeat_interleave(g, 1)) / math.sqrt(d)
    s = s.masked_fill(torch.arange(k.shape[0])[None, None, :] > torch.arange(q_offset, q_offset + t)[None, :, None],
                      -math.inf)
    return torch.einsum("htn,nhd->thd", torch.softmax(s, -1), v.double().repeat_interleave(g, 1))


MIXED = [(0, 37), (21, 1), (0, 1), (5, 70), (48, 16), (16, 3)]  # fresh prompt, decode tokens, chunks after a cache
DECODE = [(0, 1), (15, 1), (16, 1), (17, 1), (120, 1)]  # one query each, 0 to 120 keys before it
# the costlier interpreter runs: -m slow on the CPU, by default on a GPU
SLOW_ON_CPU = [] if DEVICE == "cuda" else [pytest.mark.slow]


def test_reference_equals_each_sequence_alone_in_fp64():
    q, k, v, cu, lens, tables, keys = paged_batch(MIXED, 6, 2, 60, 16, seed=1)
    out = naive_paged_attention(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), lens.cpu(), tables.cpu(), 16)
    for s, (c, n) in enumerate(MIXED):
        a, b = int(cu[s]), int(cu[s + 1])
        assert_close(out[a:b], direct(q[a:b].cpu(), keys[s][0].cpu(), keys[s][1].cpu(), c), 1e-5, f"sequence {s}")
    with pytest.raises(ValueError, match="sequences need"):
        naive_paged_attention(q, k, v, cu[:-1], lens, tables, 16)


@needs_triton
@pytest.mark.parametrize("parts,hq,hkv,d,bs,dtype", [
    (MIXED, 6, 2, 60, 16, torch.float32),  # GQA 3:1 (a tile of 64 rows holds 21 queries), D=60
    (MIXED, 6, 2, 60, 16, torch.bfloat16),
    pytest.param(MIXED, 4, 4, 32, 32, torch.float32, marks=SLOW_ON_CPU),  # no GQA, 32-key blocks
    ([(0, 130)], 8, 1, 16, 16, torch.float32),  # one long prompt: many query tiles, GQA 8:1
])
def test_paged_attention_mixed_batch(parts, hq, hkv, d, bs, dtype):
    from docqa.kernels.attention.triton_paged_attention import fused_paged_attention

    q, k, v, cu, lens, tables, _ = paged_batch(parts, hq, hkv, d, bs, dtype, seed=len(parts) + d)
    ref = naive_paged_attention(q, k, v, cu, lens, tables, bs)
    out = torch.full_like(q, float("nan"))
    got = fused_paged_attention(q, k, v, cu, lens, tables, bs, out=out, max_query_len=max(n for _, n in parts))
    assert got is out
    assert_close(got, ref, ATT_TOL[dtype])


@needs_triton
@pytest.mark.parametrize("splits", [None, 4, pytest.param(16, marks=SLOW_ON_CPU)])  # 16: more splits than a short sequence has key tiles
def test_paged_attention_decode_splits(splits):
    from docqa.kernels.attention.triton_paged_attention import fused_paged_attention

    q, k, v, cu, lens, tables, _ = paged_batch(DECODE, 8, 2, 64, 16, seed=3)
    ref = naive_paged_attention(q, k, v, cu, lens, tables, 16)
    got = fused_paged_attention(q, k, v, cu, lens, tables, 16, max_query_len=1, num_splits=splits)
    assert_close(got, ref, ATT_TOL[torch.float32])


@needs_triton
@pytest.mark.parametrize("parts,splits,picks", [(MIXED, 1, (3, 4)), (DECODE, 4, (1, 4))])
def test_a_sequence_gets_the_same_bits_alone_as_in_a_batch(parts, splits, picks):
    """Each sequence's rows are computed from its own tiles only: its output does not depend on
    the batch around it (what keeps batched greedy decoding equal to one sequence at a time).
    Picked: a prompt after 5 cached tokens and a chunk starting on a block's edge; decode tokens
    over 15 and 120 keys, with key splits."""
    from docqa.kernels.attention.triton_paged_attention import fused_paged_attention

    q, k, v, cu, lens, tables, _ = paged_batch(parts, 6, 2, 60, 16, seed=4)
    longest = max(n for _, n in parts)
    whole = fused_paged_attention(q, k, v, cu, lens, tables, 16, num_splits=splits, max_query_len=longest)
    for s in picks:
        a, b = int(cu[s]), int(cu[s + 1])
        one = torch.tensor([0, b - a], dtype=torch.int32, device=DEVICE)
        alone = fused_paged_attention(q[a:b], k, v, one, lens[s:s + 1], tables[s:s + 1], 16, num_splits=splits,
                                      max_query_len=longest)
        assert torch.equal(alone, whole[a:b])


@needs_triton
@pytest.mark.parametrize("d,group", [pytest.param(d, g, marks=[] if d == 64 else SLOW_ON_CPU) for d, g in REAL_SHAPES])
def test_paged_attention_real_shapes(d, group):
    """The head dims and GQA groups the engine serves, prefill and decode."""
    from docqa.kernels.attention.triton_paged_attention import fused_paged_attention

    parts = [(0, 20), (40, 1), (7, 9)]
    q, k, v, cu, lens, tables, _ = paged_batch(parts, 2 * group, 2, d, 64, seed=d + group)
    assert_close(fused_paged_attention(q, k, v, cu, lens, tables, 64), naive_paged_attention(q, k, v, cu, lens,
                                                                                               tables, 64),
                 ATT_TOL[torch.float32])
    dq = q[cu[1:].long() - 1]  # each sequence's last query as a decode step
    one = torch.arange(len(parts) + 1, dtype=torch.int32, device=DEVICE)
    assert_close(fused_paged_attention(dq, k, v, one, lens, tables, 64, max_query_len=1),
                 naive_paged_attention(dq, k, v, one, lens, tables, 64), ATT_TOL[torch.float32])


@needs_triton
def test_paged_attention_rejects_bad_arguments():
    from docqa.kernels.attention.triton_paged_attention import fused_paged_attention

    q, k, v, cu, lens, tables, _ = paged_batch([(0, 3)], 4, 2, 16, 16)
    with pytest.raises(ValueError, match="block_size"):
        fused_paged_attention(q, k, v, cu, lens, tables, 24)
    with pytest.raises(ValueError, match="sequences need"):
        fused_paged_attention(q, k, v, cu, lens, tables[:0], 16)
    with pytest.raises(ValueError, match="power of two"):
        fused_paged_attention(q, k, v, cu, lens, tables, 16, num_splits=3)
    with pytest.raises(ValueError, match="does not match"):
        fused_paged_attention(q[:, :3], k, v, cu, lens, tables, 16)
