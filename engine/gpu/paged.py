"""The paged KV pool of batched sequences, and the model runner that runs their forwards on the
CUDA decoder (engine/gpu/model.py `CudaDecoder`): nano-vllm's model runner, in our words.

One forward takes the parts the scheduler chose (engine/scheduler.py `Work`: some tokens of
each of several sequences — prefill chunks and single decode tokens alike) as one stack of
rows: every projection, norm and MLP runs once over all rows (the weights are read once for
the whole batch, which is what batching buys at decode), each row's key and value go to its
sequence's slot in the pool (`slot = block_table[p // block_size] * block_size + p %
block_size`), and attention runs per sequence over its own blocks through the block table.
Attention is exact (dense): the paths that batch — `ask` over retrieved passages, reviews,
served prompts — read a few thousand tokens each; a whole long document is one sequence's
work (the sparse states).

A step in which every part is one decode token replays a CUDA graph captured for the
smallest batch-size bucket that holds it (its unused entries write to a scratch block and
are ignored), so decoding a batch costs no more host time than decoding one sequence.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..scheduler import Work
from .model import DENSE_WINDOW, CudaDecoder
from ...kernels.attention.triton_sparse_attention import fused_sparse_attention

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


class ModelRunner:
    def __init__(self, decoder: CudaDecoder, cache: PagedKVCache, *, max_seqs: int):
        self.decoder, self.cache = decoder, cache
        self.device = decoder.device
        self.graphs = self.device.type == "cuda"
        self.max_seqs = max_seqs
        self._graphs: dict[int, _DecodeGraph] = {}

    @torch.inference_mode()
    def run(self, work: list[Work]) -> torch.Tensor:
        """Run the parts' tokens; fp32 logits [S, V] of the parts that sample, in order."""
        if self.graphs and all(w.count == 1 for w in work):
            return self._decode(work)
        return self._forward(work)

    # --- eager: any mix of prefill chunks and decode tokens -------------------------------------------
    def _forward(self, work: list[Work]) -> torch.Tensor:
        dec, cache, dev = self.decoder, self.cache, self.device
        bs = cache.block_size
        tokens, positions, spans, rows = [], [], [], 0
        for w in work:
            tokens += w.seq.token_ids[w.start:w.start + w.count]
            positions += range(w.start, w.start + w.count)
            table = torch.tensor(w.seq.block_table, dtype=torch.int32)
            spans.append((rows, rows + w.count, w.start, table.to(dev)))
            rows += w.count
        table_rows = [w.seq.block_table[p // bs] for w in work for p in range(w.start, w.start + w.count)]
        pos = torch.tensor(positions, dtype=torch.long)
        slots = (torch.tensor(table_rows, dtype=torch.long) * bs + pos % bs).to(dev)
        x = dec.w.embed[torch.tensor(tokens, dtype=torch.long, device=dev)]
        cos, sin = dec.cos_sin(pos.to(dev))
        for i in range(dec.config.n_layers):
            x = self._layer(i, x, cos, sin, slots, spans)
        last = [b - 1 for (a, b, _, _), w in zip(spans, work) if w.samples]
        return dec._logits(x[torch.tensor(last, device=dev)]).float()

    def _layer(self, i: int, x, cos, sin, slots, spans) -> torch.Tensor:
        dec, cache = self.decoder, self.cache
        q, k, v = dec.qkv_rows(i, x, cos, sin)
        cache.k[i].index_copy_(0, slots, k)
        cache.v[i].index_copy_(0, slots, v)
        o = torch.empty_like(q)
        none = dec._empty_selection()
        for a, b, p0, table in spans:
            fused_sparse_attention(q[a:b], cache.k[i], cache.v[i], p0, none, cache.block_size, 0, DENSE_WINDOW,
                                   block_table=table, out=o[a:b])
        return dec.after_attention(i, x, o.view(x.shape[0], dec.q_size), decode=False)

    # --- graphed: decode steps ------------------------------------------------------------------------
    def _decode(self, work: list[Work]) -> torch.Tensor:
        n = len(work)
        bucket = next((b for b in BUCKETS if b >= n), None)
        if bucket is None or bucket > self.max_seqs:
            return self._forward(work)
        g = self._graphs.get(bucket)
        if g is None:
            g = self._graphs[bucket] = _DecodeGraph(self, bucket)
        g.load(work)
        g.replay()
        return g.logits[:n].float()


class _DecodeGraph:
    """One decode step of `size` sequences over static buffers (tokens, positions, slots, block
    tables), captured as a CUDA graph; attention reads each sequence's position from its buffer."""

    def __init__(self, runner: ModelRunner, size: int):
        dev, cache = runner.device, runner.cache
        self.runner, self.size = runner, size
        self.tok = torch.zeros(size, dtype=torch.long, device=dev)
        self.pos = torch.zeros(size, dtype=torch.long, device=dev)
        self.slot = torch.zeros(size, dtype=torch.long, device=dev)
        self.table = torch.full((size, cache.num_blocks), cache.scratch, dtype=torch.int32, device=dev)
        self._pad()
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):  # compiles kernels, sets up cuBLAS handles
                self.logits = self._step()
        torch.cuda.current_stream(dev).wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()

    def _pad(self, start: int = 0) -> None:
        """Entries start.. decode a dummy token at position 0 of the scratch block."""
        cache = self.runner.cache
        self.tok[start:] = 0
        self.pos[start:] = 0
        self.slot[start:] = cache.scratch * cache.block_size
        self.table[start:, 0] = cache.scratch

    def _step(self) -> torch.Tensor:
        r = self.runner
        dec = r.decoder
        x = dec.w.embed[self.tok]
        cos, sin = dec.cos_sin(self.pos)
        spans = [(b, b + 1, self.pos[b:b + 1], self.table[b]) for b in range(self.size)]
        for i in range(dec.config.n_layers):
            x = r._layer(i, x, cos, sin, self.slot, spans)
        return dec._logits(x)

    def load(self, work: list[Work]) -> None:
        bs = self.runner.cache.block_size
        n = len(work)
        host = torch.tensor([[w.seq.token_ids[w.start], w.start, w.seq.block_table[w.start // bs] * bs + w.start % bs]
                             for w in work], dtype=torch.long)
        self.tok[:n], self.pos[:n], self.slot[:n] = (host[:, j].to(self.tok.device) for j in range(3))
        width = max(len(w.seq.block_table) for w in work)
        tables = torch.tensor([w.seq.block_table + [0] * (width - len(w.seq.block_table)) for w in work],
                              dtype=torch.int32)
        self.table[:n, :width] = tables.to(self.table.device)
        self._pad(n)

    def replay(self) -> None:
        self.graph.replay()
