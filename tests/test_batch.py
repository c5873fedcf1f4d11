"""Many sequences at once: the block manager's paged blocks and prefix sharing, the scheduler's
continuous batching, and batched forwards on the CUDA decoder (engine/batch.py).

The reference is always one sequence at a time: the scheduler against the same token rule
applied to each sequence alone, and `Engine.generate_batch` against `Engine.generate` of each
prompt — greedy tokens equal token for token (fp32, Triton interpreter on CPU tensors or a
GPU), logits within float tolerance.
"""

from __future__ import annotations

import pytest
import torch

from docqa.engine.block_manager import BlockManager
from docqa.engine.scheduler import Scheduler
from docqa.engine.sequence import Sequence, Status

# --- the block manager ---------------------------------------------------------------------------


def seq(ids, max_new=4, bs=4, **kw) -> Sequence:
    return Sequence(list(ids), max_new, bs, **kw)


def computed(bm: BlockManager, ids) -> Sequence:
    """A sequence given its blocks and computed: its full blocks are in the cache."""
    s = seq(ids)
    bm.allocate(s)
    s.num_cached_tokens = len(s)
    bm.hash_blocks(s)
    return s


def test_blocks_are_allocated_per_sequence_and_given_back():
    bm = BlockManager(8, 4)
    a = seq(range(10))  # three blocks, the last partial
    assert bm.can_allocate(a)
    bm.allocate(a)
    assert len(a.block_table) == 3 and len(set(a.block_table)) == 3 and bm.num_free == 5
    assert a.num_cached_tokens == 0
    a.token_ids += [1, 2]  # 12 tokens: the third block is full, the next token needs a fourth
    assert bm.can_append(a)
    bm.may_append(a)
    assert len(a.block_table) == 4 and bm.num_free == 4
    bm.deallocate(a)
    assert bm.num_free == 8 and not a.block_table


def test_full_blocks_are_shared_by_content_and_outlive_their_sequence():
    bm = BlockManager(8, 4)
    prefix = list(range(100, 108))  # two full blocks
    a = computed(bm, prefix + [1, 2, 3])
    b = seq(prefix + [7])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    shared = a.block_table[:2]
    bm.deallocate(a)
    bm.deallocate(b)
    assert bm.num_free == 8
    c = seq(prefix + [9, 9])  # after both ended, the cached blocks are still found
    bm.allocate(c)
    assert c.num_cached_tokens == 8 and c.block_table[:2] == shared
    # a different first block changes every later hash: nothing shared
    d = seq([0] + prefix[1:] + [5])
    bm.allocate(d)
    assert d.num_cached_tokens == 0


def test_the_block_with_the_last_token_is_never_taken_from_the_cache():
    bm = BlockManager(4, 4)
    a = computed(bm, range(8))
    b = seq(range(8))  # the same 8 tokens: the second block holds the last one, computed again
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_a_reused_block_loses_its_hash_and_a_hit_rechecks_the_tokens():
    bm = BlockManager(2, 4)
    a = computed(bm, range(6))
    first = a.block_table[0]
    bm.deallocate(a)
    # the first block's hash names tokens 0..3: a forged entry pointing it at other tokens is refused
    bm.blocks[first].token_ids = (9, 9, 9, 9)
    b = seq(list(range(4)) + [5, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    bm.deallocate(b)
    c = seq([8] * 7)  # needs both blocks: the cached ones are overwritten and forget their hashes
    bm.allocate(c)
    assert all(bm.blocks[i].hash is None for i in c.block_table)


# --- the scheduler, with a stand-in model -------------------------------------------------------------

V = 50


def next_token(tokens: list[int]) -> int:
    """The stand-in model: a token from every token before it (order-sensitive)."""
    h = 7
    for t in tokens:
        h = (h * 31 + t) % 1_000_003
    return h % V


def alone(prompt: list[int], max_new: int, stops=()) -> list[int]:
    out, toks = [], list(prompt)
    for _ in range(max_new):
        t = next_token(toks)
        if t in stops:
            break
        out.append(t)
        toks.append(t)
    return out


def run_scheduler(sched: Scheduler, seqs: list[Sequence], max_steps: int = 10_000, join_at: dict | None = None):
    """Drive the scheduler as the batch session does, checking each step's invariants: the
    token budget and sequence count, each part starting where its sequence's cached tokens end,
    blocks for every token it computes, and no block written by two sequences."""
    join_at = dict(join_at or {})
    for s in seqs[: len(seqs) - len(join_at)]:
        sched.add(s)
    steps = 0
    while sched.has_work or join_at:
        for k in [k for k, at in join_at.items() if at <= steps]:
            sched.add(seqs[k])
            del join_at[k]
        work = sched.schedule()
        assert work or join_at, "stalled"
        assert sum(w.count for w in work) <= sched.max_tokens and len(sched.running) <= sched.max_seqs
        writes = set()
        for w in work:
            s = w.seq
            assert w.start == s.num_cached_tokens and s.status == Status.RUNNING
            assert len(s.block_table) * s.block_size >= w.start + w.count
            for p in range(w.start, w.start + w.count):
                key = (s.block_table[p // s.block_size], p % s.block_size)
                assert key not in writes
                writes.add(key)
        tokens = {w.seq.seq_id: next_token(w.seq.token_ids) for w in work if w.samples}
        sched.finish(work, tokens)
        steps += 1
        assert steps < max_steps
    return steps


@pytest.mark.parametrize("blocks,budget", [(64, 64), (64, 7), (9, 16)])
def test_continuous_batching_gives_each_sequence_its_own_tokens(blocks, budget):
    """Prompts of different lengths (two sharing a prefix), one joining late: with room for all,
    with a token budget that chunks prefills, and with a pool so small that decoding preempts."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 11, 6, 9)]
    prompts.append(prompts[1][:8] + [1, 2])  # shares two blocks with prompt 1
    seqs = [seq(p, max_new=6, stop_ids=frozenset({0})) for p in prompts]
    sched = Scheduler(BlockManager(blocks, 4), max_seqs=3, max_tokens=budget)
    run_scheduler(sched, seqs, join_at={4: 3})
    for p, s in zip(prompts, seqs):
        assert s.status == Status.FINISHED and s.output == alone(p, 6, stops={0})
    assert sched.blocks.num_free == blocks


def test_an_aborted_sequence_gives_its_blocks_back():
    sched = Scheduler(BlockManager(8, 4), max_seqs=4, max_tokens=32)
    a, b = seq(range(6), max_new=20), seq(range(10, 15), max_new=3)
    sched.add(a)
    sched.add(b)
    work = sched.schedule()
    sched.finish(work, {w.seq.seq_id: 1 for w in work if w.samples})
    sched.abort(a)
    assert a.status == Status.FINISHED and a.stop_reason == "aborted" and a not in sched.running
    run_scheduler(sched, [])
    assert b.output == [1] + alone(list(range(10, 15)) + [1], 2) and sched.blocks.num_free == 8


def test_a_sequence_that_cannot_fit_the_pool_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        Scheduler(BlockManager(2, 4), max_seqs=1, max_tokens=8).add(seq(range(6), max_new=4))


# --- batched forwards on the CUDA decoder (Triton interpreter on CPU tensors, or a GPU) ----------

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_cuda_engine import DEV, ids_of, slow_on_cpu, triton_engine, triton_runs  # noqa: E402
from test_engine_vs_hf import make_tiny_hf_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_hf_dir(path, "llama")
    return triton_engine(path)


def second_best_once(logits, out):  # the decode loop's own greedy pick is wrong once
    return int(logits.argsort(descending=True)[1 if len(out) == 1 else 0])


@triton_runs
@slow_on_cpu  # minutes under the interpreter on a loaded 2-core machine; by default on a GPU
def test_batched_greedy_equals_one_at_a_time(tiny):
    """Prompts of 5-40 tokens (two sharing 32 tokens, so whole 16-token blocks are shared), a
    token budget that splits prefills across steps and mixes them with decode steps, a chooser
    on one of them: each sequence's tokens are the ones `generate` gives it alone."""
    from docqa.engine.batch import BatchSession

    prompts = [ids_of(n, seed) for n, seed in ((5, 1), (40, 2), (17, 3))]
    prompts.append(prompts[1][:32] + ids_of(3, 4))
    chooser = [None, second_best_once, None, None]
    want = [tiny.generate(p, 5, stop_ids=(), choose=c).token_ids for p, c in zip(prompts, chooser)]
    session = BatchSession(tiny, pool_tokens=256, block_size=16, max_seqs=3, max_tokens=24)
    seen = {i: [] for i in range(4)}
    reqs = [session.add(p, 5, stop_ids=(), choose=c, on_token=lambda t, _d, i=i: seen[i].append(t))
            for i, (p, c) in enumerate(zip(prompts, chooser))]
    steps = 0
    while session.has_work:
        session.step()
        steps += 1
    assert [r.result.token_ids for r in reqs] == want
    assert [seen[i] for i in range(4)] == want  # streamed as accepted
    assert reqs[3].result.prompt_tokens == 35 and session.blocks.num_free == session.blocks.blocks.__len__()
    assert steps < sum(len(p) for p in prompts)  # batched: fewer forwards than tokens


@triton_runs
def test_a_batched_forward_gives_the_prefill_logits(tiny):
    """One forward of two prompts' whole prefills: the logits of each last token equal a dense
    prefill of that prompt alone."""
    from docqa.engine.batch import BatchSession
    from docqa.engine.scheduler import Work

    session = BatchSession(tiny, pool_tokens=128, block_size=16)
    prompts = [ids_of(19, 5), ids_of(6, 6)]
    reqs = [session.add(p, 1, stop_ids=()) for p in prompts]
    work = session.scheduler.schedule()
    assert [w.count for w in work] == [19, 6]
    got = session.runner.run(work).cpu()
    for row, p in zip(got, prompts):
        want = tiny.prefill(p, tiny.new_state(32)).cpu()
        assert (row - want).abs().max() < (1e-3 if DEV == "cuda" else 1e-4)
    session.scheduler.finish(work, {w.seq.seq_id: 0 for w in work})
    assert all(isinstance(w, Work) for w in work) and all(r.seq.stop_reason for r in reqs)


@triton_runs
@slow_on_cpu
def test_generate_batch_and_stop_tokens(tiny):
    """`Engine.generate_batch` (the engine's own session): greedy results equal `generate`'s,
    stop tokens included (one prompt is stopped by the token it would generate second)."""
    prompts = [ids_of(12, 7), ids_of(30, 8)]
    free = [tiny.generate(p, 4, stop_ids=()).token_ids for p in prompts]
    stops = (free[1][1],)
    want = [tiny.generate(p, 4, stop_ids=stops) for p in prompts]
    got = tiny.generate_batch(prompts, 4, stop_ids=stops)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.stop_reason for g in got] == [w.stop_reason for w in want] and got[1].stop_reason == "stop"
    assert got[0].text == want[0].text


def test_the_cpu_engine_runs_a_batch_one_request_after_another(tmp_path):
    """Without a batched forward (the PyTorch model) the session runs each request through
    `generate`: the same results, in order."""
    from docqa.engine import Engine
    from docqa.engine.batch import SequentialSession

    make_tiny_hf_dir(tmp_path, "llama")
    eng = Engine.load(tmp_path, device="cpu")
    assert isinstance(eng.batch_session(), SequentialSession)
    prompts = [ids_of(7, 1), ids_of(13, 2)]
    assert [r.token_ids for r in eng.generate_batch(prompts, 3, stop_ids=())] == \
        [eng.generate(p, 3, stop_ids=()).token_ids for p in prompts]
