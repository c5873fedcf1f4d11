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
