"""A KV state for contexts whose KV does not fit on the GPU: a GPU ring, pinned CPU memory, disk.

`CudaKVState` (state.py) keeps every position at its own GPU row; `TieredKVCache` is the same
state with the oldest segments moved off the GPU. `engine/gpu/state.py` `new_cuda_state` picks
the tiered one when the context's KV does not fit beside the weights.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict

import torch

from ..config import ModelConfig
from ..settings import EngineSettings
from .state import KVStateBase

ON_DISK = -(1 << 31)  # table entry of a block whose segment is only on disk (see TieredKVCache)
UNMAPPED = -(1 << 30)  # table entry of a block not written yet (its keys are masked: never loaded)


class TieredKVCache(KVStateBase):
    """The CUDA decoder's KV state (state.py `CudaKVState`'s interface) for contexts whose
    KV does not fit beside the weights: GPU memory holds what it can, pinned CPU memory the
    rest, and optionally a disk directory what the CPU pool cannot.

    Segments of `segment` tokens (all layers, K and V) are the unit that moves. The GPU pool is
    the first segment (the sinks, read by every query: never moved), a ring of `ring` token rows
    and `hot_segments` "hot" segment slots; position p >= pin lives at ring row
    pin + (p - pin) % ring while it is in the ring. When a write would wrap the ring onto live
    positions, the oldest ring segment moves to a slot of the host pool, least recently written
    first — in a left-to-right prefill and in decode that is also least recently used by the
    window. Copies run on a side stream, started one chunk ahead (`prefetch`), so they overlap
    the compute; the main stream waits on a segment's event only before overwriting its rows.
    Host data is immutable once moved: a segment's host copy, hot copy and file never diverge.

    `table` [NB] int32 (device) maps each written logical block to where its keys are: r >= 0
    is row-block r of the GPU pool (ring, pin or hot slot), -1-r row-block r of the host pool,
    ON_DISK a segment that is only in its file. The attention kernel reads host blocks in place
    over PCIe (decode) or through a small GPU staging copy of the selected ones (prefill); block
    descriptors (routing) stay on the GPU for every block.

    Promotion (`hot_segments` > 0): decode counts its routing picks per block on the device
    (`record_use`, inside the CUDA graph); `rebalance()`, called by the decode loop between
    steps, copies the most used host segments (decayed counts: recency-weighted) into hot slots
    on the side stream and points their table entries there at the next call, once the main
    stream has waited for the copy. Evicting a hot segment only points its entries back at its
    host copy.

    Disk (`host_segments` caps the host pool, `disk_dir` set): when the host pool is full, its
    least recently used segment (not hot, not needed by the launch at hand) is written to
    `disk_dir/seg<N>.kv` — one file per segment, all layers: the table is shared by the layers,
    so a segment is resident for all of them or none, and one sequential write/read per move is
    the cheapest I/O — and its entries become ON_DISK. While any segment is on disk the model
    checks each attention launch's selected blocks on the host (`fault_groups`: one sync per
    launch, eager only — GraphedDecode refuses) and brings their segments back before the launch,
    so no kernel ever reads an ON_DISK entry. A file stays valid after its segment comes back:
    evicting that segment again writes nothing.
    """

    def __init__(self, config: ModelConfig, settings: EngineSettings, capacity: int, gpu_tokens: int, *,
                 dtype=torch.bfloat16, device="cuda", host_segments: int | None = None, disk_dir: str | None = None,
                 hot_segments: int = 0, track_use: bool | None = None, decay: float = 0.5, max_promote: int = 2):
        super().__init__(config, settings)
        c = config
        block, segment = settings.block_size, settings.segment_size
        self.block, self.segment, self.dtype = block, segment, dtype
        self.device = torch.device(device)
        if segment % block or segment < block:
            raise ValueError("segment must be a multiple of block")
        self.capacity = capacity = -(-capacity // segment) * segment
        self.pin = segment
        self.hot_segments = hot_segments
        ring = min(capacity - segment, (gpu_tokens - segment - hot_segments * segment) // segment * segment)
        if ring < 2 * segment:
            raise ValueError(f"a GPU pool of {gpu_tokens} tokens is too small (needs {(3 + hot_segments) * segment})")
        self.ring = ring
        self.hot_row0 = self.pin + ring  # hot slot g: rows hot_row0 + g * segment ..
        rows = self.pin + ring + hot_segments * segment
        self.k = torch.empty(c.n_layers, rows, c.n_kv_heads, c.head_dim, dtype=dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        self.n_seg = capacity // segment
        leaving = max(self.n_seg - (self.pin + ring) // segment, 1)  # segments that can leave the ring
        self.host_slots = leaving if host_segments is None else max(1, min(host_segments, leaving))
        if self.host_slots < leaving and disk_dir is None:
            raise ValueError("a capped host pool needs a disk_dir")
        pin_mem = self.device.type == "cuda"
        host_rows = self.host_slots * segment
        self.hk = torch.empty(c.n_layers, host_rows, c.n_kv_heads, c.head_dim, dtype=dtype, pin_memory=pin_mem)
        self.hv = torch.empty(c.n_layers, host_rows, c.n_kv_heads, c.head_dim, dtype=dtype, pin_memory=pin_mem)
        nb = capacity // block
        self.sb = segment // block  # blocks per segment
        self.desc_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
        self.kmin = torch.empty(c.n_layers, nb, c.n_kv_heads, c.head_dim, dtype=self.desc_dtype, device=self.device)
        self.kmax = torch.empty_like(self.kmin)
        self.kmean = torch.empty_like(self.kmin)
        self.ksum = torch.zeros(c.n_layers, c.n_kv_heads, c.head_dim, dtype=torch.float32, device=self.device)
        self.table = torch.full((nb,), UNMAPPED, dtype=torch.int32, device=self.device)
        self._seg_blocks = torch.arange(self.sb, dtype=torch.int32, device=self.device)
        self.mapped = 0  # positions < mapped have table entries
        self.evicted = self.pin  # positions pin..evicted-1 have left the ring
        self.issued = self.pin  # copies started up to here (evicted <= issued)
        self.written = 0  # positions below this were written by work queued before now
        self.pending: list[tuple[int, object]] = []  # (segment start, event) copies not yet waited for
        self.stream = torch.cuda.Stream(self.device) if pin_mem else None
        self.staging: tuple[torch.Tensor, torch.Tensor] | None = None
        # host pool: slots, and the segments whose table points at them (or at a hot copy), LRU first
        self.host_slot: dict[int, int] = {}  # segment -> host slot (copies in flight included)
        self._free_host = list(range(self.host_slots))[::-1]
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.ready: dict[int, object] = {}  # segment -> event of its copy into the host pool
        self.disk_dir = disk_dir
        self.disk: set[int] = set()  # segments whose table entries are ON_DISK
        self.on_file: set[int] = set()  # segments with a valid file
        self.hot: dict[int, int] = {}  # segment -> hot slot its table entries point at
        self.hot_copying: dict[int, tuple[int, object]] = {}  # promotions in flight: segment -> (slot, event)
        self._free_hot = list(range(hot_segments))[::-1]
        track = hot_segments > 0 if track_use is None else track_use
        self.usage = torch.zeros(nb, dtype=torch.float32, device=self.device) if track else None
        self._use_host: torch.Tensor | None = None  # snapshot of usage, copied without a host sync
        self._use_ev = None
        self._ones: dict[int, torch.Tensor] = {}
        self.decay, self.max_promote = decay, max_promote
        self.seg_bytes = 2 * c.n_layers * segment * c.n_kv_heads * c.head_dim * self.k.element_size()
        self.moves = {"segments_to_host": 0, "bytes_to_host": 0, "segments_to_disk": 0, "segments_to_disk_clean": 0,
                      "segments_from_disk": 0, "bytes_disk_io": 0, "disk_write_s": 0.0, "disk_read_s": 0.0,
                      "fault_checks": 0, "promotions": 0, "hot_evictions": 0}

    # --- what the model reads -----------------------------------------------------------------
    @property
    def ring_arg(self) -> tuple[int, int]:
        return (self.pin, self.ring)

    def host(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hk[layer], self.hv[layer]

    def staging_buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.staging is None or self.staging[0].shape[0] < rows:
            c = self.config
            self.staging = tuple(torch.empty(rows, c.n_kv_heads, c.head_dim, dtype=self.dtype, device=self.device)
                                 for _ in range(2))
        return self.staging

    def nbytes(self) -> dict:
        size = lambda *ts: sum(t.numel() * t.element_size() for t in ts)
        return {"gpu_kv": size(self.k, self.v), "host_kv": size(self.hk, self.hv),
                "hot_kv": self.hot_segments * self.seg_bytes, "descriptors": size(self.kmin, self.kmax, self.kmean)}

    def where(self, pos: int) -> str:
        """'gpu' (pin or ring), 'hot', 'host' or 'disk': where the table sends reads of `pos`."""
        seg = pos // self.segment
        if pos < self.pin or pos >= self.evicted:
            return "gpu"
        if seg in self.disk:
            return "disk"
        return "hot" if seg in self.hot else "host"

    # --- table entries --------------------------------------------------------------------------
    def _entries(self, seg: int) -> torch.Tensor:
        return self.table[seg * self.sb: (seg + 1) * self.sb]

    def _map_host(self, seg: int) -> None:
        self._entries(seg).copy_(-1 - (self.host_slot[seg] * self.sb + self._seg_blocks))

    def _map_hot(self, seg: int) -> None:
        self._entries(seg).copy_(self.hot_row0 // self.block + self.hot[seg] * self.sb + self._seg_blocks)

    def _main(self):
        return torch.cuda.current_stream(self.device) if self.stream is not None else None

    def _side(self):
        """Context for copies on the side stream, ordered after the work queued so far."""
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(self._main())
        return torch.cuda.stream(self.stream)

    def _record(self):
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    # --- movement: ring -> host -------------------------------------------------------------------
    def _row(self, p: int) -> int:
        return p if p < self.pin else self.pin + (p - self.pin) % self.ring

    def _issue(self, upto: int) -> None:
        """Start copying the ring segments below `upto` (segment-rounded) to the host."""
        upto = min(upto, self.capacity - self.ring)  # later positions never leave the ring
        # only segments the stream has already written: those before the last `prepare`'s start
        upto = min(upto, self.written // self.segment * self.segment)
        while self.issued < upto:
            a = self.issued
            seg = a // self.segment
            slot = self._take_host_slot(keep=())  # may send a segment to disk (its table flips first)
            self.host_slot[seg] = slot
            r, h = self._row(a), slot * self.segment
            with self._side():
                for layer in range(self.config.n_layers):
                    self.hk[layer, h: h + self.segment].copy_(self.k[layer, r: r + self.segment], non_blocking=True)
                    self.hv[layer, h: h + self.segment].copy_(self.v[layer, r: r + self.segment], non_blocking=True)
                ev = self._record()
            self.pending.append((a, ev))
            self.issued = a + self.segment
            self.moves["segments_to_host"] += 1
            self.moves["bytes_to_host"] += self.seg_bytes

    def _finish(self, upto: int) -> None:
        """Segments below `upto` are on the host: the main stream waits for their copies and
        their table entries switch to the host pool (their ring rows may be overwritten after)."""
        self._issue(upto)
        if self.issued < min(upto, self.capacity - self.ring):
            raise RuntimeError(f"positions below {upto} must leave the ring but are not written yet: ring too small")
        while self.pending and self.pending[0][0] < upto:
            a, ev = self.pending.pop(0)
            if ev is not None:
                self._main().wait_event(ev)
            seg = a // self.segment
            self.ready[seg] = ev
            self._map_host(seg)
            self.host_lru[seg] = None
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

    # --- movement: host <-> disk --------------------------------------------------------------------
    def _evictable(self, seg: int) -> bool:
        return seg not in self.hot and seg not in self.hot_copying

    def _take_host_slot(self, keep) -> int:
        if self._free_host:
            return self._free_host.pop()
        victim = next((s for s in self.host_lru if s not in keep and self._evictable(s)), None)
        if victim is None:
            raise RuntimeError(f"host pool of {self.host_slots} segments too small: every slot is moving, hot "
                               "or read by the launch at hand")
        self._to_disk(victim)
        return self._free_host.pop()

    def _path(self, seg: int) -> str:
        if self.disk_dir is None:
            raise RuntimeError("host pool full and no disk tier (disk_dir) configured")
        return os.path.join(self.disk_dir, f"seg{seg}.kv")

    def _host_bytes(self, slot: int):
        """The slot's data as numpy uint8 views, K layers then V layers: the file's layout."""
        a, b = slot * self.segment, (slot + 1) * self.segment
        for pool in (self.hk, self.hv):
            for layer in range(self.config.n_layers):
                yield pool[layer, a:b].view(torch.uint8).numpy()

    def _to_disk(self, seg: int) -> None:
        """Host -> disk. The table entries flip to ON_DISK on the main stream, so launches queued
        before still read the host slot; whoever refills the slot orders itself after them."""
        slot = self.host_slot.pop(seg)
        del self.host_lru[seg]
        if seg in self.on_file:
            self.moves["segments_to_disk_clean"] += 1  # host data is immutable: the file is still valid
        else:
            ev = self.ready.get(seg)
            if ev is not None:
                ev.synchronize()
            t0 = time.perf_counter()
            with open(self._path(seg), "wb") as f:
                f.writelines(self._host_bytes(slot))
            self.moves["disk_write_s"] += time.perf_counter() - t0
            self.moves["bytes_disk_io"] += self.seg_bytes
            self.on_file.add(seg)
        self.moves["segments_to_disk"] += 1
        self._entries(seg).fill_(ON_DISK)
        self.disk.add(seg)
        self.ready.pop(seg, None)
        self._free_host.append(slot)

    def _from_disk(self, seg: int, keep) -> None:
        slot = self._take_host_slot(keep)
        if self.stream is not None:
            # the CPU writes the slot: nothing queued may still read the segment that had it
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        with open(self._path(seg), "rb") as f:
            for part in self._host_bytes(slot):
                if f.readinto(part) != part.nbytes:
                    raise OSError(f"short read of {self._path(seg)}")
        self.moves["disk_read_s"] += time.perf_counter() - t0
        self.moves["bytes_disk_io"] += self.seg_bytes
        self.moves["segments_from_disk"] += 1
        self.disk.discard(seg)
        self.host_slot[seg] = slot
        self.host_lru[seg] = None
        self._map_host(seg)

    def fault_groups(self, idx: torch.Tensor, chunks: int):
        """For one attention launch over `chunks` routing chunks with selected blocks idx
        [chunks, ..., K] (-1: none): yields ranges (c0, c1) of routing chunks to launch one after
        the other. Before yielding a range, the segments its picks select that are on disk are
        brought back to the host pool (evicting LRU host segments to disk, never one this range
        reads) and their table entries fixed, so the launch that follows reads no ON_DISK entry.
        Ranges are as long as the host pool allows. One host sync per call: eager mode only."""
        self.moves["fault_checks"] += 1
        segs = (idx.reshape(chunks, -1).clamp_min(0) // self.sb).cpu()
        # segments a launch reads outside GPU memory, which host slots must hold during it
        room = self.host_slots - len(self.pending) - len(self.hot) - len(self.hot_copying)
        groups, cur, c0 = [], set(), 0
        for c in range(chunks):
            need = {x for x in segs[c].unique().tolist() if x in self.disk or (x in self.host_lru and self._evictable(x))}
            if len(need) > room:
                raise RuntimeError(f"host pool too small: one routing chunk reads {len(need)} segments outside GPU "
                                   f"memory, {room} host slots are free to hold them")
            if len(cur | need) > room:
                groups.append((c0, c, cur))
                cur, c0 = set(), c
            cur |= need
        groups.append((c0, chunks, cur))
        for a, b, need in groups:
            for x in need:
                if x in self.host_lru:
                    self.host_lru.move_to_end(x)  # recently used: the last to go to disk
            for x in sorted(need & self.disk):
                self._from_disk(x, keep=need)
            yield a, b

    def fault_in(self, idx: torch.Tensor) -> None:
        """`fault_groups` for a launch of one routing chunk (a decode step's layer)."""
        for _ in self.fault_groups(idx, 1):
            pass

    # --- promotion: host -> hot GPU slots -----------------------------------------------------------
    def record_use(self, idx: torch.Tensor) -> None:
        """Count routing picks (block indices >= 0) per block on the device: no host sync, so a
        captured decode step can do it."""
        flat = idx.reshape(-1)
        ones = self._ones.get(flat.numel())
        if ones is None:
            ones = self._ones[flat.numel()] = torch.ones(flat.numel(), dtype=torch.float32, device=self.device)
        self.usage.index_add_(0, flat, ones)

    def rebalance(self) -> None:
        """Host side, between decode steps (between graph replays). Promotions started by the last
        call are complete once the main stream waits on their events: their entries now point at
        the hot rows. The usage snapshot the last call copied (asynchronously, so no step waits
        on the host) reorders the host LRU and chooses this call's promotions; then the counts
        decay, so older use weighs less."""
        for seg, (slot, ev) in list(self.hot_copying.items()):
            if ev is not None:
                self._main().wait_event(ev)
            self.hot[seg] = slot
            self._map_hot(seg)
        self.hot_copying.clear()
        if self.usage is None:
            return
        if self._use_host is not None:
            if self._use_ev is not None:
                self._use_ev.synchronize()  # recorded one period ago: normally long done
            use = self._use_host.view(self.n_seg, self.sb).sum(1).tolist()
            used = sorted((x for x in self.host_lru if use[x] > 0), key=lambda x: use[x])
            for x in used:
                self.host_lru.move_to_end(x)
            if self.hot_segments:
                self._promote(used[::-1][: self.hot_segments], use)
        else:
            self._use_host = torch.empty(self.usage.shape, dtype=torch.float32, pin_memory=self.stream is not None)
        self._use_host.copy_(self.usage, non_blocking=True)
        if self.stream is not None:
            self._use_ev = torch.cuda.Event()
            self._use_ev.record(self._main())
        self.usage.mul_(self.decay)

    def _promote(self, want: list[int], use: list[float]) -> None:
        for seg in [x for x in want if x not in self.hot][: self.max_promote]:
            if self._free_hot:
                slot = self._free_hot.pop()
            else:
                cold = [x for x in self.hot if x not in want]
                if not cold:
                    return
                slot = self._demote(min(cold, key=lambda x: use[x]))
            self._start_promotion(seg, slot)

    def _demote(self, seg: int) -> int:
        """Hot -> host: only the table entries move (the host copy is the same data)."""
        slot = self.hot.pop(seg)
        self._map_host(seg)
        self.moves["hot_evictions"] += 1
        return slot

    def _start_promotion(self, seg: int, slot: int) -> None:
        h, r = self.host_slot[seg] * self.segment, self.hot_row0 + slot * self.segment
        # after the side stream waits for the main one: launches that read the slot's previous
        # segment are done before it is overwritten
        with self._side():
            for layer in range(self.config.n_layers):
                self.k[layer, r: r + self.segment].copy_(self.hk[layer, h: h + self.segment], non_blocking=True)
                self.v[layer, r: r + self.segment].copy_(self.hv[layer, h: h + self.segment], non_blocking=True)
            ev = self._record()
        self.hot_copying[seg] = (slot, ev)
        self.moves["promotions"] += 1

    def close(self) -> None:
        """Remove this cache's segment files."""
        for seg in self.on_file:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._path(seg))
        self.on_file.clear()
