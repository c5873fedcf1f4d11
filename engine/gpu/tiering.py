"""KV segments in three tiers: GPU memory, pinned CPU memory, disk — with LRU movement.

A segment is the K/V (all layers) of `segment_size` consecutive tokens, one fixed-shape
tensor. The GPU and CPU tiers are preallocated slot pools; disk holds one raw file per
segment. Host<->device copies run on a side stream, so a prefetch overlaps the decode that
runs on the main stream; a caller that needs a segment waits on that segment's event
(`wait`), never on the whole stream.

Placement policy: `fetch` brings a segment to the GPU, evicting the least recently used
GPU segment to CPU (and the least recently used CPU segment to disk when the CPU pool is
full). Pinned slots are reused; nothing is allocated per move.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import torch


@dataclass
class _Where:
    tier: str  # "gpu", "cpu" or "disk"
    slot: int = -1
    ready: torch.cuda.Event | None = field(default=None, repr=False)


class SegmentTiers:
    def __init__(self, seg_shape: tuple[int, ...], dtype: torch.dtype, gpu_slots: int, cpu_slots: int,
                 disk_dir: str | None = None, device: str = "cuda"):
        if gpu_slots < 1 or cpu_slots < 0:
            raise ValueError("need at least one GPU slot")
        self.seg_shape, self.dtype, self.device = seg_shape, dtype, torch.device(device)
        self.gpu = torch.empty((gpu_slots, *seg_shape), dtype=dtype, device=self.device)
        pin = self.device.type == "cuda"
        self.cpu = torch.empty((cpu_slots, *seg_shape), dtype=dtype, pin_memory=pin)
        self.disk_dir = disk_dir
        self.stream = torch.cuda.Stream(self.device) if pin else None
        self.where: dict[int, _Where] = {}
        self._lru = {"gpu": OrderedDict(), "cpu": OrderedDict()}  # seg id -> None, oldest first
        self._free = {"gpu": list(range(gpu_slots))[::-1], "cpu": list(range(cpu_slots))[::-1]}
        self.moves = {"h2d": 0, "d2h": 0, "to_disk": 0, "from_disk": 0}

    # --- bookkeeping ------------------------------------------------------------------------
    def tier(self, seg: int) -> str:
        return self.where[seg].tier

    def _take_slot(self, tier: str) -> int:
        if not self._free[tier]:
            victim, _ = self._lru[tier].popitem(last=False)
            self._demote(victim)
        return self._free[tier].pop()

    def _place(self, seg: int, tier: str, slot: int = -1, ready=None) -> None:
        self.where[seg] = _Where(tier, slot, ready)
        if tier in self._lru:
            self._lru[tier][seg] = None

    def _release(self, seg: int) -> None:
        w = self.where[seg]
        if w.tier in self._lru:
            self._lru[w.tier].pop(seg, None)
            self._free[w.tier].append(w.slot)

    def _path(self, seg: int) -> str:
        if self.disk_dir is None:
            raise RuntimeError("CPU tier full and no disk tier configured")
        return os.path.join(self.disk_dir, f"seg{seg}.bin")

    # --- moves --------------------------------------------------------------------------------
    def _copy(self, dst: torch.Tensor, src: torch.Tensor, after: torch.cuda.Event | None):
        if self.stream is None:
            dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # src was written there
        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def _demote(self, seg: int) -> None:
        """One tier down: GPU -> CPU (-> disk when the CPU pool is full), CPU -> disk."""
        w = self.where[seg]
        if w.tier == "gpu":
            if self.cpu.shape[0] == 0:
                self._to_disk(seg, self.gpu[w.slot])
                return
            slot = self._take_slot("cpu")
            ev = self._copy(self.cpu[slot], self.gpu[w.slot], w.ready)
            self.moves["d2h"] += 1
            self._release(seg)
            self._place(seg, "cpu", slot, ev)
        elif w.tier == "cpu":
            self._to_disk(seg, self.cpu[w.slot])

    def _to_disk(self, seg: int, src: torch.Tensor) -> None:
        w = self.where[seg]
        if w.ready is not None:
            w.ready.synchronize()
        host = src.cpu() if src.is_cuda else src
        host.view(torch.uint8).numpy().tofile(self._path(seg))
        self.moves["to_disk"] += 1
        self._release(seg)
        self._place(seg, "disk")

    def put(self, seg: int, data: torch.Tensor) -> None:
        """Store a new segment (any device) on the GPU tier."""
        if seg in self.where:
            self._release(seg)
        slot = self._take_slot("gpu")
        self.gpu[slot].copy_(data)
        self._place(seg, "gpu", slot)

    def fetch(self, seg: int) -> torch.Tensor:
        """Start bringing `seg` to the GPU (async from pinned memory); returns its GPU slot view.
        Call `wait(seg)` before a kernel on the current stream reads it."""
        w = self.where[seg]
        if w.tier == "gpu":
            self._lru["gpu"].move_to_end(seg)
            return self.gpu[w.slot]
        if w.tier == "disk":
            self._from_disk(seg)
            w = self.where[seg]
        slot = self._take_slot("gpu")
        ev = self._copy(self.gpu[slot], self.cpu[w.slot], w.ready)
        self.moves["h2d"] += 1
        self._release(seg)
        self._place(seg, "gpu", slot, ev)
        return self.gpu[slot]

    def _from_disk(self, seg: int) -> None:
        raw = torch.from_file(self._path(seg), size=self.cpu[0].numel() * self.cpu.element_size(), dtype=torch.uint8)
        slot = self._take_slot("cpu")
        self.cpu[slot].view(torch.uint8).view(-1).copy_(raw)
        os.remove(self._path(seg))
        self.moves["from_disk"] += 1
        self._place(seg, "cpu", slot)

    def wait(self, seg: int) -> None:
        w = self.where[seg]
        if w.ready is not None and self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(w.ready)

    def get(self, seg: int) -> torch.Tensor:
        """The segment's data as a tensor on whatever tier holds it (CPU copy for disk)."""
        w = self.where[seg]
        if w.ready is not None:
            w.ready.synchronize()
        if w.tier == "gpu":
            return self.gpu[w.slot]
        if w.tier == "cpu":
            return self.cpu[w.slot]
        raw = torch.from_file(self._path(seg), size=self.cpu[0].numel() * self.cpu.element_size(), dtype=torch.uint8)
        return raw.view(self.dtype).view(self.seg_shape)


class TieredKVCache:
    """The bench model's KV cache (engine/gpu/model.py `KVCache`'s interface) for contexts whose
    KV does not fit beside the weights: GPU memory holds what it can, pinned CPU memory the rest.

    Segments of `segment` tokens (all layers, K and V) are the unit that moves. The GPU pool is
    the first segment (the sinks, read by every query: never moved) followed by a ring of `ring`
    token rows; position p >= pin lives at ring row pin + (p - pin) % ring while it is on the
    GPU. When a write would wrap the ring onto live positions, the oldest ring segment moves to
    the host pool (row p - pin), least recently written first — in a left-to-right prefill and
    in decode that is also least recently used by the window. Copies run on a side stream,
    started one chunk ahead (`prefetch`), so they overlap the compute; the main stream waits on
    a segment's event only before overwriting its rows.

    `table` [NB] int32 (device) maps each written logical block to where its keys are: r >= 0
    is row-block r of the GPU pool, -1-r row-block r of the host pool. The attention kernel
    reads host blocks in place over PCIe (decode) or through a small GPU staging copy of the
    selected ones (prefill); block descriptors (routing) stay on the GPU for every block.
    """

    def __init__(self, shape, capacity: int, gpu_tokens: int, *, dtype=torch.bfloat16, block: int = 64,
                 segment: int = 2048, device="cuda"):
        s = self.shape = shape
        self.block, self.segment, self.dtype = block, segment, dtype
        self.device = torch.device(device)
        if segment % block or segment < block:
            raise ValueError("segment must be a multiple of block")
        self.capacity = capacity = -(-capacity // segment) * segment
        self.pin = segment
        ring = min(capacity - segment, (gpu_tokens - segment) // segment * segment)
        if ring < 2 * segment:
            raise ValueError(f"a GPU pool of {gpu_tokens} tokens is too small (needs {3 * segment})")
        self.ring = ring
        rows = self.pin + ring
        self.k = torch.empty(s.layers, rows, s.kv_heads, s.head_dim, dtype=dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        host_rows = max(capacity - rows, segment)
        pin_mem = self.device.type == "cuda"
        self.hk = torch.empty(s.layers, host_rows, s.kv_heads, s.head_dim, dtype=dtype, pin_memory=pin_mem)
        self.hv = torch.empty(s.layers, host_rows, s.kv_heads, s.head_dim, dtype=dtype, pin_memory=pin_mem)
        nb = capacity // block
        self.desc_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
        self.kmin = torch.empty(s.layers, nb, s.kv_heads, s.head_dim, dtype=self.desc_dtype, device=self.device)
        self.kmax = torch.empty_like(self.kmin)
        self.kmean = torch.empty_like(self.kmin)
        self.ksum = torch.zeros(s.layers, s.kv_heads, s.head_dim, dtype=torch.float32, device=self.device)
        self.table = torch.full((nb,), -(1 << 30), dtype=torch.int32, device=self.device)
        self.mapped = 0  # positions < mapped have table entries
        self.evicted = self.pin  # positions pin..evicted-1 live on the host
        self.issued = self.pin  # copies started up to here (evicted <= issued)
        self.written = 0  # positions below this were written by work queued before now
        self.pending: list[tuple[int, object]] = []  # (segment start, event) copies not yet waited for
        self.stream = torch.cuda.Stream(self.device) if pin_mem else None
        self.staging: tuple[torch.Tensor, torch.Tensor] | None = None
        self.moves = {"segments_to_host": 0, "bytes_to_host": 0}

    # --- what the model reads -----------------------------------------------------------------
    @property
    def ring_arg(self) -> tuple[int, int]:
        return (self.pin, self.ring)

    def host(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hk[layer], self.hv[layer]

    def staging_buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.staging is None or self.staging[0].shape[0] < rows:
            s = self.shape
            self.staging = tuple(torch.empty(rows, s.kv_heads, s.head_dim, dtype=self.dtype, device=self.device)
                                 for _ in range(2))
        return self.staging

    def nbytes(self) -> dict:
        size = lambda *ts: sum(t.numel() * t.element_size() for t in ts)
        return {"gpu_kv": size(self.k, self.v), "host_kv": size(self.hk, self.hv),
                "descriptors": size(self.kmin, self.kmax, self.kmean)}

    def where(self, pos: int) -> str:
        return "gpu" if pos < self.pin or pos >= self.evicted else "host"

    # --- movement -------------------------------------------------------------------------------
    def _row(self, p: int) -> int:
        return p if p < self.pin else self.pin + (p - self.pin) % self.ring

    def _issue(self, upto: int) -> None:
        """Start copying the ring segments below `upto` (segment-rounded) to the host."""
        upto = min(upto, self.capacity - self.ring)  # later positions never leave the ring
        # only segments the stream has already written: those before the last `prepare`'s start
        upto = min(upto, self.written // self.segment * self.segment)
        while self.issued < upto:
            a = self.issued
            r, h = self._row(a), a - self.pin
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                ctx = torch.cuda.stream(self.stream)
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                for layer in range(self.shape.layers):
                    self.hk[layer, h: h + self.segment].copy_(self.k[layer, r: r + self.segment], non_blocking=True)
                    self.hv[layer, h: h + self.segment].copy_(self.v[layer, r: r + self.segment], non_blocking=True)
                ev = None
                if self.stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(self.stream)
            self.pending.append((a, ev))
            self.issued = a + self.segment
            self.moves["segments_to_host"] += 1
            self.moves["bytes_to_host"] += 2 * self.shape.layers * self.segment * self.k[0, 0].numel() * self.k.element_size()

    def _finish(self, upto: int) -> None:
        """Segments below `upto` are on the host: the main stream waits for their copies and
        their table entries switch to the host pool (their ring rows may be overwritten after)."""
        self._issue(upto)
        if self.issued < min(upto, self.capacity - self.ring):
            raise RuntimeError(f"positions below {upto} must leave the ring but are not written yet: ring too small")
        b = self.block
        while self.pending and self.pending[0][0] < upto:
            a, ev = self.pending.pop(0)
            if ev is not None:
                torch.cuda.current_stream(self.device).wait_event(ev)
            blocks = torch.arange(a // b, (a + self.segment) // b, device=self.device, dtype=torch.int32)
            self.table[a // b: (a + self.segment) // b] = -1 - (blocks - self.pin // b)
            self.evicted = a + self.segment

    def _round(self, p: int) -> int:
        return -(-p // self.segment) * self.segment

    def prepare(self, start: int, end: int) -> None:
        """Make positions start..end-1 writable on the GPU and mapped in the table."""
        if end > self.capacity:
            raise ValueError(f"position {end} past the capacity {self.capacity}")
        if max(start, self.pin) < min(end, self.evicted):
            raise ValueError(f"positions from {start} already moved to the host (up to {self.evicted})")
        self.written = max(self.written, min(start, self.mapped))
        self._finish(self._round(end - self.ring))
        if end > self.mapped:
            b = self.block
            blocks = torch.arange(self.mapped // b, -(-end // b), device=self.device, dtype=torch.int64)
            p = blocks * b
            rows = torch.where(p < self.pin, p, self.pin + (p - self.pin) % self.ring)
            self.table[self.mapped // b: -(-end // b)] = (rows // b).to(torch.int32)
            self.mapped = -(-end // b) * b

    def prefetch(self, end: int) -> None:
        """Start, on the side stream, the moves that a later `prepare(..., end)` will need."""
        self._issue(min(self._round(end - self.ring), self.capacity))
