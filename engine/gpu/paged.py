"""The paged KV pool of batched sequences, and the model runner that runs their forwards on the
CUDA decoder (engine/gpu/model.py `CudaDecoder`): nano-vllm's model runner, in our words.

One forward takes the parts the scheduler chose (engine/scheduler.py `Work`: prefill chunks of
several sequences, or one decode token of each running sequence) as one stack of rows: every
projection, norm and MLP runs once over all rows (the weights are read once for the whole
batch, which is what batching buys at decode), each row's key and value go to its sequence's
slot in the pool (`slot = block_table[p // block_size] * block_size + p % block_size`), and
one attention launch per layer covers every sequence, each over its own blocks through its row
of the block tables (kernels/attention/triton_paged_attention.py). Attention is exact (dense):
the paths that batch — `ask` over retrieved passages, reviews, served prompts — read a few
thousand tokens each; a whole long document is one sequence's work (the sparse states).

A decode step replays a CUDA graph captured for the smallest batch-size bucket that holds it
(its unused entries decode a dummy token in a scratch block and are ignored): the host only
copies each sequence's token, position and block table row in, so decoding a batch costs
little more host time than decoding one sequence. Off CUDA (the Triton interpreter in tests)
the same step runs eagerly over the same buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from ..config import ModelConfig
from ..scheduler import Work
from .model import CudaDecoder
from ...kernels.attention.triton_paged_attention import fused_paged_attention

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # decode graphs are captured per batch size


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype.itemsize


class PagedKVCache:
    """Per layer K and V rows [(num_blocks + 1) * block_size, Hkv, D]: block b is rows
    b * block_size.. of every layer; the block past the last is the decode graphs' scratch."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device):
        c = config
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch = num_blocks
        shape = (c.n_layers, (num_blocks + 1) * block_size, c.n_kv_heads, c.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


@dataclass
class Batch:
    """Where a forward's rows go, on the device: row r is a token at positions[r] whose key and
    value land in pool row slots[r]; sequence s owns rows cu_q[s]..cu_q[s+1]-1, has lens[s]
    tokens with them, and its blocks in tables[s]."""

    positions: torch.Tensor  # [T] long
    slots: torch.Tensor  # [T] long
    cu_q: torch.Tensor  # [S + 1] int32
    lens: torch.Tensor  # [S] int32
    tables: torch.Tensor  # [S, W] int32
    max_query_len: int  # 1: a decode step


def block_tables(work: list[Work], fill: int) -> torch.Tensor:
    """[S, W] int32 host tensor of the parts' block tables, W the longest, padded with `fill`."""
    width = max(len(w.seq.block_table) for w in work)
    return torch.tensor([w.seq.block_table + [fill] * (width - len(w.seq.block_table)) for w in work],
                        dtype=torch.int32)


class ModelRunner:
    def __init__(self, decoder: CudaDecoder, cache: PagedKVCache):
        self.decoder, self.cache = decoder, cache
        self.device = decoder.device
        self._graphs: dict[int, _DecodeGraph] = {}

    @torch.inference_mode()
    def run(self, work: list[Work]) -> torch.Tensor:
        """Run the parts' tokens; fp32 logits [S, V] of the parts that sample, in order."""
        bucket = next((b for b in BUCKETS if b >= len(work)), None)
        # a decode step (the graph returns every part's logits: a one-token prefill chunk that
        # does not sample, possible when the token budget runs out, goes the eager way)
        if bucket is not None and all(w.count == 1 and w.samples for w in work):
            g = self._graphs.get(bucket)
            if g is None:
                g = self._graphs[bucket] = _DecodeGraph(self, bucket)
            return g.run(work)
        return self._forward(work)

    # --- eager: prefill chunks of many sequences (any parts) ------------------------------------------
    def _forward(self, work: list[Work]) -> torch.Tensor:
        dec, dev, bs = self.decoder, self.device, self.cache.block_size
        counts = torch.tensor([w.count for w in work])
        starts = torch.tensor([w.start for w in work])
        cu = torch.zeros(len(work) + 1, dtype=torch.int32)
        torch.cumsum(counts, 0, out=cu[1:])
        tables = block_tables(work, self.cache.scratch)
        # per row: its part, position and pool slot, with a few tensor ops over all rows
        part = torch.repeat_interleave(torch.arange(len(work)), counts)
        pos = starts[part] + torch.arange(len(part)) - cu[:-1][part]
        slots = tables[part, pos // bs].long() * bs + pos % bs
        tokens = torch.tensor(list(chain.from_iterable(w.seq.token_ids[w.start:w.start + w.count] for w in work)))
        b = Batch(pos.to(dev), slots.to(dev), cu.to(dev), (starts + counts).int().to(dev), tables.to(dev),
                  int(counts.max()))
        x = self._layers(tokens.to(dev), b)
        last = (cu[1:].long() - 1)[torch.tensor([w.samples for w in work])]
        return dec._logits(x[last.to(dev)]).float()

    def _layers(self, tokens: torch.Tensor, b: Batch) -> torch.Tensor:
        dec = self.decoder
        x = dec.w.embed[tokens]
        cos, sin = dec.cos_sin(b.positions)
        for i in range(dec.config.n_layers):
            x = self._layer(i, x, cos, sin, b)
        return x

    def _layer(self, i: int, x, cos, sin, b: Batch) -> torch.Tensor:
        dec, cache = self.decoder, self.cache
        q, k, v = dec.qkv_rows(i, x, cos, sin)
        cache.k[i].index_copy_(0, b.slots, k)
        cache.v[i].index_copy_(0, b.slots, v)
        o = fused_paged_attention(q, cache.k[i], cache.v[i], b.cu_q, b.lens, b.tables, cache.block_size,
                                  max_query_len=b.max_query_len)
        return dec.after_attention(i, x, o.view(x.shape[0], dec.q_size), decode=False)


class _DecodeGraph:
    """One decode step of `size` sequences over static buffers (tokens, positions, block tables;
    slots and lengths follow from those on the device), captured as a CUDA graph."""

    def __init__(self, runner: ModelRunner, size: int):
        dev, cache = runner.device, runner.cache
        self.runner, self.size = runner, size
        self.tok = torch.zeros(size, dtype=torch.long, device=dev)
        self.pos = torch.zeros(size, dtype=torch.long, device=dev)
        self.table = torch.full((size, cache.num_blocks), cache.scratch, dtype=torch.int32, device=dev)
        self.cu = torch.arange(size + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(size, device=dev)
        self.graph = None
        if dev.type != "cuda":
            return
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):  # compiles kernels, sets up cuBLAS handles
                self.logits = self._step()
        torch.cuda.current_stream(dev).wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()

    def _step(self) -> torch.Tensor:
        bs = self.runner.cache.block_size
        slots = self.table[self.rows, self.pos // bs].long() * bs + self.pos % bs
        b = Batch(self.pos, slots, self.cu, (self.pos + 1).int(), self.table, 1)
        return self.runner.decoder._logits(self.runner._layers(self.tok, b))

    def run(self, work: list[Work]) -> torch.Tensor:
        """Load the sequences' tokens, positions and tables (entries past them decode a dummy
        token at position 0 of the scratch block) and run the step: logits [n, V] fp32."""
        n, scratch = len(work), self.runner.cache.scratch
        host = torch.tensor([[w.seq.token_ids[w.start] for w in work] + [0] * (self.size - n),
                             [w.start for w in work] + [0] * (self.size - n)])
        tables = block_tables(work, scratch)
        self.tok.copy_(host[0])
        self.pos.copy_(host[1])
        self.table[:n, :tables.shape[1]].copy_(tables)
        self.table[n:, 0] = scratch
        if self.graph is None:
            return self._step()[:n].float()
        self.graph.replay()
        return self.logits[:n].float()
