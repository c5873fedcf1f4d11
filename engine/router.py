"""Which distant blocks a query chunk reads: candidates, scores, top-k.

For a chunk whose queries have absolute indices c0..c_end, the keys every query of the chunk
sees anyway are the sinks (j < sink_tokens) and the window of the *last* query
(j > c_end - window); any key the first query has in its own window is there too. Candidate
blocks are therefore the blocks holding a key in [sink_tokens, c_end - window + 1); choosing
all of them makes the attention exactly dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.attention import naive_block_scores, naive_topk_blocks
from .settings import EngineSettings


@dataclass(frozen=True)
class Route:
    block_idx: torch.Tensor  # LongTensor [Hkv, K], sorted ascending
    first: int  # candidate blocks are first..end-1
    end: int

    @property
    def covered(self) -> bool:
        """Every candidate was selected: the attention equals dense attention."""
        return self.block_idx.shape[1] == max(0, self.end - self.first)


def routing_chunks(t: int, settings: EngineSettings) -> list[tuple[int, int]]:
    """Query ranges [a, b) of a t-query attend call that share one routing decision.

    The last `route_tail` queries route on their own: in a prompt's final prefill chunk they
    are the question and the assistant prefix, whose blocks would otherwise be outvoted by the
    chunk's hundreds of document queries (bench/results/passkey.md). The rest is cut every
    `route_chunk` queries.
    """
    tail = settings.route_tail
    head = t - tail if 0 < tail < t else t
    rc = settings.route_chunk
    spans = [(a, min(head, a + rc)) for a in range(0, head, rc)]
    return spans + ([(head, t)] if head < t else [])


def candidate_range(c_end: int, settings: EngineSettings) -> tuple[int, int]:
    """Blocks first..end-1 hold keys some query of a chunk ending at c_end may miss."""
    b = settings.block_size
    outside = c_end - settings.window + 1  # keys < outside are outside the last query's window
    if outside <= settings.sink_tokens:
        return 0, 0
    return settings.sink_tokens // b, -(-outside // b)


def route(
    q: torch.Tensor,
    kmin: torch.Tensor,
    kmax: torch.Tensor,
    kmean: torch.Tensor,
    c_end: int,
    settings: EngineSettings,
) -> Route:
    """Select top_k candidate blocks per kv head for the query chunk q [T, Hq, D] ending at c_end.

    q must live in the same positional frame as the descriptors [NB, Hkv, D]; the selection is
    shared by the chunk's queries and by the query heads of a GQA group.
    """
    first, end = candidate_range(c_end, settings)
    hkv = kmin.shape[1]
    if end <= first:
        return Route(torch.empty(hkv, 0, dtype=torch.long, device=q.device), first, end)
    if end - first <= settings.top_k:  # nothing to choose: skip the scoring
        idx = torch.arange(first, end, device=q.device).expand(hkv, -1)
        return Route(idx, first, end)
    scores = naive_block_scores(q, kmin[:end], kmax[:end], kmean[:end], settings.block_score)
    if settings.route_shared:
        return Route(shared_topk_blocks(scores, settings.top_k, settings.route_shared, first, end), first, end)
    return Route(naive_topk_blocks(scores, settings.top_k, first, end), first, end)


def shared_topk_blocks(scores: torch.Tensor, top_k: int, shared: int, first: int, end: int) -> torch.Tensor:
    """top_k blocks per kv head, `shared` of them common to all heads.

    The common ones are the blocks that stand out most for some head: scores are standardised
    per head over the candidates (heads' scales differ), then maxed over heads. Each head fills
    the rest with its own best blocks. Returns LongTensor [Hkv, top_k] sorted ascending.
    """
    cand = scores[:, first:end].float()
    z = (cand - cand.mean(1, keepdim=True)) / cand.std(1, keepdim=True).clamp_min(1e-6)
    common = z.amax(0).topk(shared).indices + first  # [shared]
    rest = scores.float().clone()
    rest[:, common] = float("-inf")
    own = naive_topk_blocks(rest, top_k - shared, first, end)
    both = torch.cat([common.expand(scores.shape[0], -1), own], dim=1)
    return both.sort(dim=1).values
