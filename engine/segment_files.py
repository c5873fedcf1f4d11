"""Segment files: one full KV segment (every layer's K/V and block descriptors) per safetensors
file, with a checksum of its tensor bytes in the header.

The prefix cache writes them so that another process asking about the same document starts
from them, and the CPU cache's disk tier spills to them. They are safetensors files, so any
tool reads them; reading them back fast is this module's other job: an 8B model's 128K-token
document is 62 files of 256 MiB, and a new process wants them on the GPU before its first
token. `SegmentReader` reads them with several threads into pinned host buffers (the page
cache's copy moves at memory speed) and copies each piece to the GPU as soon as it is in, so
the copies overlap the reads; the checksums are then computed where the bytes landed.

The checksum is a position-weighted sum of the bytes read as 32-bit words, mod 2**64: integer
sums do not depend on the order of addition, so the GPU and the CPU get the same value, and the
GPU computes it for 16 GiB in milliseconds (sha256 took ~8 s on one core). It finds damaged or
overwritten bytes (a change of any one word changes it); it is not meant to resist tampering.
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load, save_file

CHECKSUM_KEY = "checksum"
_WEIGHT_MOD = 65521  # word weights 1..65521: any one changed word changes the sum
_CHECKSUM_CHUNK = 1 << 24  # words per step: bounds the int64 temporaries at 128 MiB each


def _words_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of word_i * (i % 65521 + 1) over t's bytes as int32 words (zero-padded), as a 0-dim
    int64 tensor on t's device (no host sync)."""
    b = t.detach().contiguous().view(torch.uint8).reshape(-1)
    if b.numel() % 4:
        b = torch.cat([b, b.new_zeros(4 - b.numel() % 4)])
    w = b.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for a in range(0, w.numel(), _CHECKSUM_CHUNK):
        part = w[a:a + _CHECKSUM_CHUNK].to(torch.int64)
        weight = torch.arange(a, a + part.numel(), dtype=torch.int64, device=t.device) % _WEIGHT_MOD + 1
        total += (part * weight).sum()
    return total


def tensor_checksums(groups: list[dict[str, torch.Tensor]]) -> list[str]:
    """The checksum string of each dict of tensors (by name), with one read-back for all."""
    parts = [[(name, _words_sum(d[name])) for name in sorted(d)] for d in groups]
    flat = [s for p in parts for _, s in p]
    values = torch.stack(flat).tolist() if flat else []
    out, at = [], 0
    for p in parts:
        out.append(",".join(f"{name}:{v & (2**64 - 1):016x}" for (name, _), v in zip(p, values[at:at + len(p)])))
        at += len(p)
    return out


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    return tensor_checksums([tensors])[0]


def write_segment_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None,
                       checksum: str | None = None) -> None:
    """Write tensors (CPU) and metadata as a new file: readers never see half a file, and a file
    once in place is never replaced (another writer's copy of the same segment stays: a reader
    of its header then reads the bytes that header describes). A writer killed mid-write leaves
    only a `*.tmp` file, which the prefix cache removes later. `checksum`: the tensors'
    `tensor_checksum` when the caller computed it already (on the GPU)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.contiguous().cpu() for n, t in tensors.items()}
    meta = dict(metadata or {})
    meta[CHECKSUM_KEY] = checksum or tensor_checksum(tensors)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        try:
            os.link(tmp, path)  # fails where a file is already in place
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


FILE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F8_E4M3": torch.float8_e4m3fn,
           "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def read_header(source: Path | int) -> tuple[dict[str, str], dict[str, dict], int] | None:
    """(metadata, tensor entries {name: {dtype, shape, data_offsets}}, offset of the data) of a
    segment file (a path, or a file descriptor open on one); None when it is missing or not a
    safetensors file."""
    try:
        fd = os.open(source, os.O_RDONLY) if not isinstance(source, int) else source
    except OSError:
        return None
    try:
        (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        if n > 1 << 26:
            return None
        header = json.loads(os.pread(fd, n, 8))
    except (OSError, ValueError, struct.error):
        return None
    finally:
        if fd is not source:
            os.close(fd)
    if not isinstance(header, dict):
        return None
    meta = header.pop("__metadata__", None) or {}
    return meta, header, 8 + n


def read_segment_file(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor] | None:
    """Every tensor of a segment file, or None when it is unreadable, gone, or its bytes do not
    match the checksum in its header. The header and the tensors come from one read, so they
    belong to one file even if another process removes it and writes it anew meanwhile."""
    try:
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        checksum = json.loads(data[8:8 + n]).get("__metadata__", {}).get(CHECKSUM_KEY)
        tensors = load(data)
    except Exception:  # gone, truncated or foreign
        return None
    del data
    if checksum is None or tensor_checksum(tensors) != checksum:
        return None
    return {name: t.to(device) for name, t in tensors.items()}


class SegmentReader:
    """Reads byte ranges of files into device tensors: `threads` readers fill pinned host buffers
    of `chunk` bytes, and each filled buffer is copied to the device on a side stream while
    the next reads run. On the CPU (tests) the reads land in the destination directly."""

    def __init__(self, device: torch.device, threads: int | None = None, buffers: int = 32, chunk: int = 8 << 20):
        self.device = device
        # one reader per core, up to 16: copying out of the page cache is memory-bound per thread
        self.threads = threads or max(2, min(16, os.cpu_count() or 2))
        self.n_buffers, self.chunk = buffers, chunk
        self._pool: ThreadPoolExecutor | None = None
        self._buffers: list[torch.Tensor] = []
        self._stream = None
        self.stats = {"bytes": 0, "read_s": 0.0, "check_s": 0.0}  # since the last `reset_stats`

    def reset_stats(self) -> None:
        self.stats = {"bytes": 0, "read_s": 0.0, "check_s": 0.0}

    def _setup(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="docqa-kv-read")
        if self.device.type == "cuda" and not self._buffers:
            self._buffers = [torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True) for _ in range(self.n_buffers)]
            self._stream = torch.cuda.Stream(self.device)

    @staticmethod
    def _pread(fd: int, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"short read at byte {offset + done}")
            done += got

    def read(self, jobs: list[tuple[Path | int, int, torch.Tensor]]) -> None:
        """jobs: (file, byte offset, destination) — the destination's bytes (a contiguous tensor)
        are filled from the file at that offset; a file is a path or a descriptor the caller
        keeps open. Returns when the data is usable on the current stream."""
        self._setup()
        t0 = time.perf_counter()
        fds: dict[Path, int] = {}  # the files opened here
        try:
            pieces = []
            for file, offset, dst in jobs:
                if not isinstance(file, int) and file not in fds:
                    fds[file] = os.open(file, os.O_RDONLY)
                fd = file if isinstance(file, int) else fds[file]
                flat = dst.view(torch.uint8).reshape(-1)
                for a in range(0, flat.numel(), self.chunk):
                    pieces.append((fd, offset + a, flat[a:a + self.chunk]))
            if self.device.type != "cuda":
                list(self._pool.map(lambda p: self._pread(p[0], memoryview(p[2].numpy()), p[1]), pieces))
            else:
                self._read_pinned(pieces)
                torch.cuda.current_stream(self.device).synchronize()  # for the figure only: the data is in
        finally:
            for fd in fds.values():
                os.close(fd)
        self.stats["bytes"] += sum(p[2].numel() for p in pieces)
        self.stats["read_s"] += time.perf_counter() - t0

    def _read_pinned(self, pieces) -> None:
        stream, bufs = self._stream, self._buffers
        stream.wait_stream(torch.cuda.current_stream(self.device))  # destinations were made on it
        events: list = [None] * len(bufs)
        views = [memoryview(b.numpy()) for b in bufs]

        def fill(i: int, piece) -> tuple[int, object]:
            if events[i] is not None:
                events[i].synchronize()  # the buffer's previous copy to the device is done
            fd, offset, dst = piece
            self._pread(fd, views[i][:dst.numel()], offset)
            return i, piece

        running = deque(self._pool.submit(fill, i, p) for i, p in enumerate(pieces[:len(bufs)]))
        nxt = len(running)
        while running:
            i, (_, _, dst) = running.popleft().result()
            with torch.cuda.stream(stream):
                dst.copy_(bufs[i][:dst.numel()], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
                events[i] = ev
            if nxt < len(pieces):
                running.append(self._pool.submit(fill, i, pieces[nxt]))
                nxt += 1
        torch.cuda.current_stream(self.device).wait_stream(stream)
