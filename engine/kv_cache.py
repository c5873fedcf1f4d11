"""The segmented KV cache: blocks for routing, segments for storage, tiers for capacity.

Keys are stored *before* RoPE, so a reader can give any key any position (see sparse_state).
The sequence is cut into segments of `segment_size` tokens; a segment owns, for every layer,
its keys and values [L, segment_size, Hkv, D] and the descriptors of its blocks
[L, segment_size / block_size, Hkv, D] (min, max, mean key). Descriptors are small and always
stay resident, so routing never touches spilled K/V; only the blocks a query selects are
loaded back.

Tiers: a full ("sealed") segment may leave the device when more than `live_segments` are live:
to host memory when the device is a GPU, else (or when the host tier is full) to a safetensors
file. Movement is least-recently-used; the segment being written is always live.

A sealed segment may be shared (the prefix cache hands the same object to several states): it
is never written again. Truncating into a shared segment copies it first, so a state's later
appends never reach the cached copy.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from .segment_files import read_segment_file, write_segment_file

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(eq=False)
class Segment:
    start: int  # absolute index of its first token
    size: int  # capacity in tokens
    length: int = 0  # committed tokens
    k: torch.Tensor | None = None  # [L, size, Hkv, D] when live or on host, else None
    v: torch.Tensor | None = None
    kmin: torch.Tensor | None = None  # [L, size // block, Hkv, D] fp32, always resident
    kmax: torch.Tensor | None = None
    kmean: torch.Tensor | None = None
    disk_path: Path | None = None  # a safetensors copy of k/v exists here
    shared: bool = False  # handed to the prefix cache: immutable from now on
    hash: str | None = None  # prefix-chain hash once saved in the prefix cache
    token_ids: tuple[int, ...] | None = field(default=None, repr=False)
    checksum: str | None = None  # of its file's tensors (engine/segment_files.py), once known

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def full(self) -> bool:
        return self.length == self.size

    @property
    def resident(self) -> bool:
        return self.k is not None

    def nbytes(self) -> int:
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes


def segment_tensors(seg: Segment) -> dict[str, torch.Tensor]:
    """What a segment file holds: K/V [L, length, Hkv, D] and the block descriptors."""
    assert seg.k is not None
    return {"k": seg.k[:, : seg.length], "v": seg.v[:, : seg.length], "kmin": seg.kmin, "kmax": seg.kmax,
            "kmean": seg.kmean}


def segment_metadata(seg: Segment) -> dict[str, str]:
    return {"start": str(seg.start), "size": str(seg.size), "length": str(seg.length)}


class SegmentedKVCache:
    """Per-layer raw K/V and block descriptors of one sequence, in segments across tiers."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        segment_size: int = 2048,
        block_size: int = 64,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        live_segments: int = 0,
        host_segments: int = 0,
        spill_dir: str | Path | None = None,
        v_dim: int | None = None,
    ):
        assert segment_size % block_size == 0
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        # Values as wide as keys unless told otherwise (MLA stores indexer keys there instead).
        self.v_dim = v_dim or head_dim
        self.segment_size, self.block_size = segment_size, block_size
        self.dtype, self.device = dtype, torch.device(device)
        self.live_segments, self.host_segments = live_segments, host_segments
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self.segments: list[Segment] = []
        self.num_tokens = 0
        self._lru: OrderedDict[int, Segment] = OrderedDict()  # id -> segment, oldest first
        self.loads = 0  # segments brought back from host or disk (for tests and stats)
        self.spills = 0

    # --- layout ---------------------------------------------------------------------------

    @property
    def blocks_per_segment(self) -> int:
        return self.segment_size // self.block_size

    def _new_segment(self, start: int) -> Segment:
        shape = (self.n_layers, self.segment_size, self.n_kv_heads, self.head_dim)
        dshape = (self.n_layers, self.blocks_per_segment, self.n_kv_heads, self.head_dim)
        seg = Segment(
            start=start,
            size=self.segment_size,
            k=torch.zeros(shape, dtype=self.dtype, device=self.device),
            v=torch.zeros(shape[:3] + (self.v_dim,), dtype=self.dtype, device=self.device),
            kmin=torch.zeros(dshape, device=self.device),
            kmax=torch.zeros(dshape, device=self.device),
            kmean=torch.zeros(dshape, device=self.device),
        )
        return seg

    def _segments_for(self, a: int, b: int) -> list[Segment]:
        """Segments overlapping positions [a, b)."""
        first, last = a // self.segment_size, (b - 1) // self.segment_size
        return [self.segments[i] for i in range(first, last + 1)]

    def _ensure_writable(self, b: int) -> None:
        while len(self.segments) * self.segment_size < b:
            self.segments.append(self._new_segment(len(self.segments) * self.segment_size))
        for i in range(self.num_tokens // self.segment_size, len(self.segments)):
            seg = self.segments[i]
            if seg.start >= b:
                break
            if seg.shared:
                self.segments[i] = seg = self._private_copy(seg)
            self._load(seg)

    def _private_copy(self, seg: Segment) -> Segment:
        self._load(seg)
        copy = Segment(start=seg.start, size=seg.size, length=seg.length,
                       k=seg.k.clone(), v=seg.v.clone(), kmin=seg.kmin.clone(),
                       kmax=seg.kmax.clone(), kmean=seg.kmean.clone())
        if copy.k.shape[1] < copy.size:  # loaded from a file that held only `length` tokens
            pad = copy.size - copy.k.shape[1]
            copy.k = torch.nn.functional.pad(copy.k, (0, 0, 0, 0, 0, pad))
            copy.v = torch.nn.functional.pad(copy.v, (0, 0, 0, 0, 0, pad))
        return copy

    # --- writing ----------------------------------------------------------------------------

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store raw keys/values [T, Hkv, D] of `layer` at absolute positions start..start+T-1."""
        if start != self.num_tokens:
            raise ValueError(f"writes append at {self.num_tokens}, not at {start}")
        b = start + k.shape[0]
        self._ensure_writable(b)
        for seg in self._segments_for(start, b):
            lo, hi = max(start, seg.start), min(b, seg.start + seg.size)
            seg.k[layer, lo - seg.start : hi - seg.start] = k[lo - start : hi - start].to(self.dtype)
            seg.v[layer, lo - seg.start : hi - seg.start] = v[lo - start : hi - start].to(self.dtype)
            self._touch(seg)

    def write_descriptors(self, layer: int, first_block: int, kmin, kmax, kmean) -> None:
        """Descriptors [nb, Hkv, D] of blocks first_block.. of `layer`."""
        bps = self.blocks_per_segment
        nb = kmin.shape[0]
        b = first_block
        while b < first_block + nb:
            seg = self.segments[b // bps]
            lo = b - (b // bps) * bps
            n = min(bps - lo, first_block + nb - b)
            src = slice(b - first_block, b - first_block + n)
            seg.kmin[layer, lo : lo + n] = kmin[src]
            seg.kmax[layer, lo : lo + n] = kmax[src]
            seg.kmean[layer, lo : lo + n] = kmean[src]
            b += n

    def commit(self, n: int) -> None:
        self.num_tokens += n
        for seg in self.segments:
            if not seg.shared:
                seg.length = max(0, min(seg.size, self.num_tokens - seg.start))
        self._enforce_budget()

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate a cache of {self.num_tokens} tokens to {n}")
        keep = -(-n // self.segment_size)
        for seg in self.segments[keep:]:
            self._lru.pop(id(seg), None)
        del self.segments[keep:]
        if keep and n % self.segment_size:
            i = keep - 1
            if self.segments[i].shared:
                self.segments[i] = self._private_copy(self.segments[i])
            self.segments[i].length = n - self.segments[i].start
        self.num_tokens = n

    def adopt(self, segments: list[Segment]) -> None:
        """Start from shared full segments (a cached prefix); the cache must be empty."""
        assert self.num_tokens == 0 and not self.segments
        for seg in segments:
            assert seg.full and seg.shared and seg.size == self.segment_size
        self.segments = list(segments)
        self.num_tokens = sum(s.length for s in segments)
        for seg in segments:
            if seg.resident:
                self._touch(seg)
        self._enforce_budget()

    # --- reading ------------------------------------------------------------------------------

    def range(self, layer: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw keys and values [b-a, Hkv, D] of positions a..b-1 (written, maybe uncommitted)."""
        ks, vs = [], []
        for seg in self._segments_for(a, b):
            self._load(seg)
            lo, hi = max(a, seg.start) - seg.start, min(b, seg.start + seg.size) - seg.start
            ks.append(seg.k[layer, lo:hi])
            vs.append(seg.v[layer, lo:hi])
        if len(ks) == 1:
            return ks[0], vs[0]
        return torch.cat(ks), torch.cat(vs)

    def gather(self, layer: int, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw keys/values of per-head positions idx [Hkv, M] -> [Hkv, M, D] each."""
        hkv, m = idx.shape
        k = torch.empty(hkv, m, self.head_dim, dtype=self.dtype, device=self.device)
        v = torch.empty(hkv, m, self.v_dim, dtype=self.dtype, device=self.device)
        heads = torch.arange(hkv, device=idx.device)[:, None].expand(hkv, m)
        seg_of = idx // self.segment_size
        for s in seg_of.unique().tolist():
            sel = seg_of == s
            seg = self.segments[s]
            self._load(seg)
            rows, hs = idx[sel] - seg.start, heads[sel]
            k[sel] = seg.k[layer, rows, hs]
            v[sel] = seg.v[layer, rows, hs]
        return k, v

    def descriptors(self, layer: int, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """kmin, kmax, kmean [n_blocks, Hkv, D] of `layer` (resident even for spilled segments)."""
        bps = self.blocks_per_segment
        need = -(-n_blocks // bps)
        parts = [(s.kmin[layer], s.kmax[layer], s.kmean[layer]) for s in self.segments[:need]]
        out = [torch.cat([p[i] for p in parts])[:n_blocks] for i in range(3)]
        return out[0], out[1], out[2]

    # --- tiers --------------------------------------------------------------------------------

    def _touch(self, seg: Segment) -> None:
        self._lru.pop(id(seg), None)
        self._lru[id(seg)] = seg

    def _load(self, seg: Segment) -> None:
        if seg.k is not None and seg.k.device == self.device:
            self._touch(seg)
            return
        if seg.k is not None:  # host tier
            seg.k, seg.v = seg.k.to(self.device), seg.v.to(self.device)
        else:
            assert seg.disk_path is not None, "segment has no copy anywhere"
            data = load_file(str(seg.disk_path), device=str(self.device))
            seg.k, seg.v = data["k"].to(self.dtype), data["v"].to(self.dtype)
        self.loads += 1
        self._touch(seg)
        self._enforce_budget(keep=seg)

    def _enforce_budget(self, keep: Segment | None = None) -> None:
        if not self.live_segments:
            return
        tail = self.segments[self.num_tokens // self.segment_size] if self.num_tokens // self.segment_size < len(self.segments) else None
        live = [s for s in self._lru.values() if s.k is not None and s.k.device == self.device]
        excess = len(live) - self.live_segments
        for seg in live:
            if excess <= 0:
                break
            if seg is keep or seg is tail or not seg.full:
                continue
            self._spill(seg)
            excess -= 1

    def _spill(self, seg: Segment) -> None:
        on_host = sum(1 for s in self._lru.values() if s.k is not None and s.k.device.type == "cpu")
        if self.device.type != "cpu" and (not self.host_segments or on_host < self.host_segments):
            seg.k, seg.v = seg.k.cpu(), seg.v.cpu()
        else:
            if seg.disk_path is None or not seg.disk_path.exists():
                if self.spill_dir is None:
                    return  # nowhere to go: stays live, over budget
                seg.disk_path = self.spill_dir / f"spill-{uuid.uuid4().hex}.safetensors"
                write_segment_file(seg.disk_path, segment_tensors(seg), segment_metadata(seg))
            seg.k = seg.v = None
            self._lru.pop(id(seg), None)
        self.spills += 1

    def resident_segments(self) -> int:
        return sum(1 for s in self.segments if s.k is not None and s.k.device == self.device)


class SegmentedState:
    """The prefix cache's side of a state kept in a `SegmentedKVCache` (`self.cache`)."""

    def export_segment(self, i: int) -> Segment:
        """Segment i itself, resident: the prefix cache shares it from now on (read-only)."""
        seg = self.cache.segments[i]
        self.cache._load(seg)
        return seg

    def adopt(self, segments: list[Segment]) -> int:
        """Start from cached segments. Those known only by their file are read and checked now;
        returns how many were adopted: all, or those before the first whose file is damaged or
        gone (the caller prefills from there)."""
        c = self.cache
        n = 0
        for seg in segments:
            if seg.kmin is None:  # the prefix cache read only the file's header
                t = read_segment_file(seg.disk_path)
                if t is None:
                    break
                seg.kmin, seg.kmax, seg.kmean = t["kmin"], t["kmax"], t["kmean"]
                seg.k, seg.v = t["k"].to(c.device, c.dtype), t["v"].to(c.device, c.dtype)
            n += 1
        c.adopt(segments[:n])
        return n

