"""KV states of the CUDA decoder (engine/gpu/model.py), and the one factory that picks them.

- `CudaKVState`: per-layer time-major K/V `[capacity, Hkv, D]` on the GPU (keys stored rotated
  at their true positions), per-block min/max/mean key descriptors for routing and the fp32 key
  sum of each layer's open block (decode's append continues it).
- `tiering.TieredKVCache`: the same state for contexts whose KV does not fit beside the
  weights (a GPU ring, pinned CPU memory, optionally disk).

Both carry the engine settings they were built under (routing reads them per call) and the
`num_tokens` / `truncate` / `export_segment` / `adopt` protocol the engine and the prefix cache
use on every device (engine/attention.py has the CPU side).
"""

from __future__ import annotations

import gc
import os
import time

import torch

from ...kernels.attention.triton_kvstore import NO_RING
from ..config import ModelConfig
from ..kv_cache import DTYPES, Segment
from ..segment_files import CHECKSUM_KEY, FILE_DTYPES, SegmentReader, read_header, tensor_checksum, tensor_checksums
from ..settings import EngineSettings

# Left free on the GPU beside the KV: prefill activations of a 4096-token chunk of an 8B model
# (~1 GiB), cuBLAS workspaces, the CUDA graph's pool, the staging buffers of tiered prefill.
RESERVE_BYTES = 6 * 2**30


class KVStateBase:
    """What every CUDA KV state shares: settings, the token count, and prefix-cache segments."""

    table = None  # no block table: logical block = physical block
    disk: tuple | set = ()  # no segment on disk
    usage = None  # no promotion counts
    ring_arg = NO_RING  # every position at its own row
    pin = 0
    evicted = 0

    def __init__(self, config: ModelConfig, settings: EngineSettings):
        self.config, self.settings = config, settings
        # whether a forward's queries share routed blocks (per routing chunk): then a prefill of
        # [token, draft] is not two decode steps, and MTP does not speculate (Engine._verifies_exactly)
        self.routed = settings.attention != "dense"
        self.num_tokens = 0
        self.decode_graph = None  # GraphedDecode bound to this state's buffers, made on first decode
        # keys are rotated at true positions: not interchangeable with the CPU state's unrotated ones
        self.layout = "rotated-true"
        if config.mla is None and (config.rope_interleaved or config.rotary_dim not in (None, config.head_dim)):
            # GLM-4 / 4.5: q/k dims in CudaDecoder's load order (model.py `rope_halves_order`), not HF's
            self.layout += "-halves"

    def host(self, layer: int):
        return None

    def commit(self, n: int) -> None:
        self.num_tokens += n

    def truncate(self, n: int) -> None:
        """Forget the tokens after the first n. The next prefill re-reads the open block's stored
        keys for its descriptors (fused_store_kv_blocks), so nothing needs recomputing here."""
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot truncate {self.num_tokens} tokens to {n}")
        if self.pin <= n < self.evicted:
            raise ValueError(f"tokens from {n} already left the GPU (up to {self.evicted})")
        self.num_tokens = n

    # --- rows ----------------------------------------------------------------------------------
    def _row(self, p: int) -> int:
        return p

    def prepare(self, start: int, end: int) -> None:
        """Make positions start..end-1 writable (a no-op where every position has its own row)."""

    # --- prefix-cache segments -----------------------------------------------------------------
    def _segment_views(self, a: int) -> dict[str, torch.Tensor]:
        """The state's tensors of the segment starting at position a, named as in its file."""
        size, b = self.settings.segment_size, self.settings.block_size
        r = self._row(a)
        nb0, nb1 = a // b, (a + size) // b
        return {"k": self.k[:, r:r + size], "v": self.v[:, r:r + size], "kmin": self.kmin[:, nb0:nb1],
                "kmax": self.kmax[:, nb0:nb1], "kmean": self.kmean[:, nb0:nb1]}

    def export_segment(self, i: int) -> Segment:
        """Segment i (K/V [L, S, Hkv, D] and descriptors, as stored) for the prefix cache, with
        the checksum of its file computed here on the GPU: views of this state's rows, which the
        cache's writer copies out in the background (a full state keeps every row where it is);
        a tiered state's rows are reused by its ring, so it gives CPU copies at once."""
        size = self.settings.segment_size
        a = i * size
        if a + size > self.num_tokens:
            raise ValueError(f"segment {i} is not full")
        if self.pin <= a < self.evicted:
            raise ValueError(f"segment {i} is no longer on the GPU")
        views = self._segment_views(a)
        checksum = tensor_checksum(views)
        if self.table is not None:
            views = {name: t.cpu() for name, t in views.items()}
        return Segment(start=a, size=size, length=size, checksum=checksum, **views)

    def adopt(self, segments: list[Segment], reader: SegmentReader | None = None) -> int:
        """Start this (empty) state with the prefix `segments` (consecutive, from 0). Segments in
        host memory are copied in; those known only by their file are read straight into the
        state's rows (`reader`, engine/segment_files.py) and checked there against their
        checksum. Returns how many were adopted: all, or those before the first damaged file."""
        if self.num_tokens:
            raise ValueError("adopt needs an empty state")
        size = self.settings.segment_size
        reader = reader or SegmentReader(self.k.device)
        # a tiered state moves old segments out of its ring as new ones come in: one at a time
        batch = 1 if self.table is not None else max(1, len(segments))
        n = 0
        for g in range(0, len(segments), batch):
            group = segments[g:g + batch]
            jobs, checks, fds = [], [], []
            try:
                for i, seg in enumerate(group):
                    if seg.start != (g + i) * size or seg.length != size:
                        raise ValueError("segments must be full and consecutive from 0")
                    self.prepare(seg.start, seg.start + size)
                    views = self._segment_views(seg.start)
                    held = [getattr(seg, name) for name in views]  # at once: the cache's writer may drop them
                    if all(t is not None for t in held):
                        for t, src in zip(views.values(), held):
                            t.copy_(src, non_blocking=True)
                        continue
                    opened = _open_segment_file(seg.disk_path, views)
                    if opened is None:
                        group = group[:i]
                        break
                    fds.append(opened[0])
                    jobs += opened[1]
                    checks.append((i, opened[2], views))
                reader.read(jobs)
            finally:
                for fd in fds:
                    os.close(fd)
            t0 = time.perf_counter()
            bad = _first_mismatch(checks)
            reader.stats["check_s"] += time.perf_counter() - t0
            if bad is not None:
                group = group[:bad]
            n += len(group)
            self.num_tokens = n * size
            if len(group) < min(batch, len(segments) - g):
                break
        return n


def _open_segment_file(path, views: dict[str, torch.Tensor]):
    """(descriptor, read jobs, checksum) that fill `views` from a segment file: the file opened
    once, its header and tensors read through that descriptor (one file even if another process
    removes it and writes it anew meanwhile), one job per layer (the state's rows of a segment
    are contiguous within a layer). None when the file is gone or does not hold tensors of these
    shapes and dtypes."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (OSError, TypeError):
        return None
    header = read_header(fd)
    jobs = []
    for name, t in views.items():
        e = (header[1] if header else {}).get(name)
        if e is None or FILE_DTYPES.get(e["dtype"]) != t.dtype or tuple(e["shape"]) != tuple(t.shape):
            os.close(fd)
            return None
        per_layer = t[0].numel() * t.element_size() if t.shape[0] else 0  # a tensor may have no layers
        for layer in range(t.shape[0]):
            jobs.append((fd, header[2] + e["data_offsets"][0] + layer * per_layer, t[layer]))
    return fd, jobs, header[0].get(CHECKSUM_KEY)


def _first_mismatch(checks) -> int | None:
    """Index (in its group) of the first segment whose bytes, where they landed, do not give the
    checksum its file's header holds."""
    got = tensor_checksums([views for _, _, views in checks])
    return next((i for (i, want, _), c in zip(checks, got) if c != want), None)


class CudaKVState(KVStateBase):
    def __init__(self, config: ModelConfig, settings: EngineSettings, capacity: int, *,
                 device: torch.device | str = "cuda"):
        super().__init__(config, settings)
        c, b = config, settings.block_size
        self.device = torch.device(device)
        self.dtype = DTYPES[settings.kv_dtype]
        capacity = -(-capacity // b) * b
        dims = (c.n_layers, capacity, c.n_kv_heads, c.head_dim)
        self.k = torch.empty(dims, dtype=self.dtype, device=self.device)
        self.v = torch.empty(dims, dtype=self.dtype, device=self.device)
        nb = capacity // b
        # bf16 descriptors (tensor-core scoring) unless the cache itself is fp32 (CPU checks)
        self.desc_dtype = torch.float32 if self.dtype == torch.float32 else torch.bfloat16
        self.kmin = torch.empty(c.n_layers, nb, c.n_kv_heads, c.head_dim, dtype=self.desc_dtype, device=self.device)
        self.kmax = torch.empty_like(self.kmin)
        self.kmean = torch.empty_like(self.kmin)
        self.ksum = torch.zeros(c.n_layers, c.n_kv_heads, c.head_dim, dtype=torch.float32, device=self.device)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.kmin, self.kmax, self.kmean))

    def reserve(self, n: int) -> None:
        """Room for n tokens: grows (by doubling) with what is stored kept. A captured decode
        graph points at the old buffers, so it is dropped."""
        if n <= self.capacity:
            return
        b = self.settings.block_size
        cap = -(-max(n, 2 * self.capacity) // b) * b
        old = (self.k, self.v, self.kmin, self.kmax, self.kmean)
        c = self.config
        self.k = torch.empty(c.n_layers, cap, c.n_kv_heads, c.head_dim, dtype=self.dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        self.kmin, self.kmax, self.kmean = (torch.empty(c.n_layers, cap // b, c.n_kv_heads, c.head_dim,
                                                        dtype=self.desc_dtype, device=self.device) for _ in range(3))
        m = self.num_tokens
        self.k[:, :m], self.v[:, :m] = old[0][:, :m], old[1][:, :m]
        nb = -(-m // b)
        for new, prev in zip((self.kmin, self.kmax, self.kmean), old[2:]):
            new[:, :nb] = prev[:, :nb]
        self.decode_graph = None


def kv_bytes_per_token(config: ModelConfig, settings: EngineSettings) -> int:
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * DTYPES[settings.kv_dtype].itemsize


def new_cuda_state(config: ModelConfig, settings: EngineSettings, capacity: int, device: torch.device, *,
                   gpu_kv_bytes: int | None = None, disk_dir: str | None = None, hot_segments: int = 0):
    """A `CudaKVState` when `capacity` tokens of KV fit in the GPU's free memory (less
    RESERVE_BYTES, or `gpu_kv_bytes` if given), else a `TieredKVCache` whose GPU ring takes what
    fits and pinned CPU memory the rest."""
    per_tok = kv_bytes_per_token(config, settings)
    b = settings.block_size
    desc_per_tok = 3 * config.n_layers * config.n_kv_heads * config.head_dim * 2 / b
    if gpu_kv_bytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if capacity * (per_tok + desc_per_tok) > free - RESERVE_BYTES:
                # before tiering, give back what dropped states still hold (a collection costs
                # tens of ms in a large heap, so only when the context would not fit)
                gc.collect()
                torch.cuda.empty_cache()
                free, _ = torch.cuda.mem_get_info(device)
            gpu_kv_bytes = max(0, free - RESERVE_BYTES)
        else:
            gpu_kv_bytes = 1 << 62  # the Triton interpreter on CPU tensors (tests)
    if capacity * (per_tok + desc_per_tok) <= gpu_kv_bytes:
        return CudaKVState(config, settings, capacity, device=device)
    from .tiering import TieredKVCache

    gpu_tokens = int((gpu_kv_bytes - capacity * desc_per_tok) // per_tok)
    seg = settings.segment_size
    # the ring must hold a prefill chunk and the window before it, plus the segment in flight
    need = seg + -(-(settings.chunk_size + settings.window) // seg) * seg + seg
    if gpu_tokens < need:
        raise RuntimeError(f"GPU memory for {gpu_tokens} tokens of KV is below the {need} a {capacity}-token "
                           "context needs on the GPU at once (window + prefill chunk)")
    return TieredKVCache(config, settings, capacity, gpu_tokens, dtype=DTYPES[settings.kv_dtype], device=device,
                         disk_dir=disk_dir, hot_segments=hot_segments)
