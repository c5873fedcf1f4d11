"""Per-document prefix cache: a question on an already-read document prefills only the question.

Keys. A cache *namespace* is (document key, model hash, settings.cache_key()); the document
key is the caller's content hash of the document. Within it, segment i of a prompt is keyed by
a hash chain over token ids, nano-vllm style:

    h_0 = sha256(namespace),  h_{i+1} = sha256(h_i || token ids of segment i)

so a segment's key commits to the namespace and to every token before and in it. Only full
segments are cached. A hit re-checks what the key stands for: the stored token ids and the
stored namespace must equal the request's, so a hash collision, a renamed file or another
document that happens to share a prefix can never serve K/V it did not produce.

Tiers. Cached segments live in memory (shared, immutable `Segment`s, LRU over all documents,
at most `memory_segments`; a GPU state's segments are its own rows until the background
writer has copied them to their file, then the file alone) and on disk under `cache_dir` as
one safetensors file per segment (engine/segment_files.py; LRU by access time, at most
`disk_bytes`). Every save writes through to disk, so another process asking about the same
document loads the prefix from there.

States built from the cache share its segments read-only; a state that appends, or truncates
into a cached segment, writes into its own copy (kv_cache.py), never into the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import torch

from .kv_cache import Segment, segment_metadata, segment_tensors
from .segment_files import CHECKSUM_KEY, read_header, write_segment_file
from .settings import EngineSettings


log = logging.getLogger(__name__)

# A `*.tmp` file older than this was left by a writer that died (a write takes seconds).
STALE_TMP_S = 3600


def default_cache_dir() -> Path:
    from .settings import cache_home

    return cache_home() / "docqa" / "kv"


def _ids_bytes(ids: Sequence[int]) -> bytes:
    return torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes()


def chain_hashes(namespace: str, ids: Sequence[int], segment_size: int) -> list[str]:
    """Hash of every full segment of `ids`, each seeded with the previous one."""
    h = hashlib.sha256(namespace.encode()).hexdigest()
    out = []
    for start in range(0, len(ids) - segment_size + 1, segment_size):
        h = hashlib.sha256(h.encode() + _ids_bytes(ids[start:start + segment_size])).hexdigest()
        out.append(h)
    return out


class PrefixCache:
    """Caches the full segments of document prompts for one model and one engine setting.

    States come from `new_state(capacity)` (the engine's own factory: the PyTorch sparse state
    on the CPU, the CUDA decoder's state on a GPU); a state gives its segments with
    `export_segment(i)` and starts from cached ones with `adopt(segments)`. Besides the
    segments, the last state saved stays live (`live`): a later prompt that shares its prefix
    continues it in place (truncated to the shared tokens), which on a GPU skips copying the
    document's KV back from host memory or disk."""

    def __init__(
        self,
        new_state,
        model_hash: str,
        settings: EngineSettings,
        *,
        shape: tuple[int, ...],
        layout: str,
        cache_dir: str | Path | None = None,
        memory_segments: int = 64,
        disk_bytes: int = 20 * 2**30,
        keep_live: bool = False,
        reader=None,
    ):
        self._new_state, self.model_hash, self.settings = new_state, model_hash, settings
        self.reader = reader  # a GPU state's fast file reader (engine/segment_files.py), kept for the process
        self.shape, self.layout = shape, layout
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.memory_segments, self.disk_bytes = memory_segments, disk_bytes
        self.keep_live = keep_live
        # (namespace, token ids, state, [(hash, segment, its file's write)] of the segments saved from it)
        self.live: tuple[str, tuple[int, ...], object, list] | None = None
        self._memory: OrderedDict[str, Segment] = OrderedDict()  # chain hash -> segment, LRU first
        self.hits_memory = self.hits_disk = self.misses = 0
        self.hits_live = 0
        self._prefetched = None  # ((doc_key, prompt ids, capacity), future of `_get_state`)
        self._writer = None  # one background thread writes segment files (`flush` waits for it)
        self._pending: list = []
        self._pinned: dict[str, torch.Tensor] = {}  # the writer's host buffers for GPU segments
        self.write_error: str | None = None  # why files cannot be written here (warned once)

    # --- keys ------------------------------------------------------------------------------

    def namespace(self, doc_key: str) -> str:
        # the layout: the CPU state stores keys before RoPE, the CUDA state rotated at true positions
        return json.dumps([doc_key, self.model_hash, self.settings.cache_key(), list(self.shape), self.layout])

    def _path(self, h: str) -> Path:
        return self.cache_dir / h[:2] / f"{h}.safetensors"

    # --- API -------------------------------------------------------------------------------

    @classmethod
    def for_engine(cls, engine, settings: EngineSettings | None = None, **kw) -> "PrefixCache":
        """A cache for a loaded `Engine` (its sparse settings unless given)."""
        settings = settings or engine.sparse_settings()
        return cls.for_checkpoint(engine.checkpoint, settings, lambda capacity: engine.new_state(capacity, settings),
                                  triton=engine.triton, device=engine.device, **kw)

    @classmethod
    def for_checkpoint(cls, checkpoint, settings: EngineSettings, new_state, *, triton: bool,
                       device: torch.device, **kw) -> "PrefixCache":
        """A cache keyed by the sha256 of a checkpoint's file(s), whose states come from
        `new_state(capacity)`. Needs no weights: `Engine.load` makes it before reading them when
        it is asked to read a document's cached KV meanwhile (`prefetch`)."""
        from .default_model import file_sha256

        path = Path(checkpoint.path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        model_hash = hashlib.sha256("".join(file_sha256(f) for f in files).encode()).hexdigest()
        c = checkpoint.config
        kw.setdefault("keep_live", triton)
        if triton:  # files are read straight into the GPU state's rows
            from .segment_files import SegmentReader

            kw.setdefault("reader", SegmentReader(device))
        return cls(new_state, model_hash, settings, shape=(c.n_layers, c.n_kv_heads, c.head_dim),
                   layout=new_state(1).layout, **kw)

    @classmethod
    def for_config(cls, config, model_hash: str, settings: EngineSettings | None = None, rope=None,
                   **kw) -> "PrefixCache":
        """A cache whose states are the PyTorch sparse state on the CPU (tests, tools)."""
        from .rope import Rope
        from .sparse_state import SparseKVState

        settings = settings or EngineSettings()
        rope = rope if rope is not None else Rope(config)
        if config.mla is not None:  # MLA/DSA: latents + indexer keys in the same segments
            from .mla_state import MLAKVState

            make = lambda capacity: MLAKVState(config, rope, settings=settings)
        else:
            make = lambda capacity: SparseKVState(config, settings, rope)
        return cls(make, model_hash, settings, shape=(config.n_layers, config.n_kv_heads, config.head_dim),
                   layout=make(1).layout, **kw)

    def new_state(self, capacity: int = 1024):
        return self._new_state(capacity)

    def prefetch(self, doc_key: str, prompt_ids: Sequence[int], capacity: int | None = None, *,
                 new_state=None) -> None:
        """Start `get_state(doc_key, prompt_ids, capacity)` on a background thread; the next
        `get_state` call for the same prompt takes its state. A new process asking about a
        document read before overlaps reading its KV files (16 GiB for 128K tokens of an 8B
        model, ~2 s) with loading the model's weights. `new_state`: the factory of this one
        state, when it is not the cache's (see `Engine.load`)."""
        from concurrent.futures import ThreadPoolExecutor

        key = (doc_key, tuple(prompt_ids), capacity)
        pool = ThreadPoolExecutor(1, thread_name_prefix="docqa-kv-prefetch")
        self._prefetched = (key, pool.submit(self._get_state, doc_key, prompt_ids, capacity, new_state))
        pool.shutdown(wait=False)

    def get_state(self, doc_key: str, prompt_ids: Sequence[int], capacity: int | None = None) -> tuple[object, int]:
        """A state holding the longest cached prefix of prompt_ids, and its length. `capacity`:
        the tokens the caller will put in the state in all (prompt and answer).

        Only full segments are reused from the segment tiers, and never the whole prompt: the
        last prompt token is always left to prefill, since generation needs its logits. The
        live state serves any shared prefix, segment-aligned or not.
        """
        if self._prefetched is not None:
            (key, future), self._prefetched = self._prefetched, None
            got = future.result()  # waits for it (its errors are the caller's)
            if key == (doc_key, tuple(prompt_ids), capacity):
                return got
            del got  # another prompt: its GPU memory goes back before a new state is made
        return self._get_state(doc_key, prompt_ids, capacity)

    def _get_state(self, doc_key: str, prompt_ids: Sequence[int], capacity: int | None,
                   new_state=None) -> tuple[object, int]:
        ns = self.namespace(doc_key)
        if self.reader is not None:
            self.reader.reset_stats()
        usable = list(prompt_ids[: max(0, len(prompt_ids) - 1)])
        capacity = capacity or len(prompt_ids) + 1
        size = self.settings.segment_size
        segments: list[Segment] = []
        for i, h in enumerate(chain_hashes(ns, usable, size)):
            seg = self._lookup(h, ns, tuple(usable[i * size:(i + 1) * size]))
            if seg is None:
                break
            segments.append(seg)
        reuse = self._live_prefix(ns, usable)
        if reuse is not None and reuse[1] >= len(segments) * size:
            state, n = reuse
            state.truncate(n)
            self.hits_live += 1
            return state, n
        state = (new_state or self.new_state)(capacity)
        if segments:
            n = state.adopt(segments, reader=self.reader) if self.reader else state.adopt(segments)
            if n < len(segments):
                self._damaged(segments[n])
        return state, state.num_tokens

    def _damaged(self, seg: Segment) -> None:
        """A segment file that failed its checksum where it was read, or vanished (another
        process's disk limit removed it): the segment and those after it are prefilled again,
        and the next save writes it anew."""
        if seg.disk_path is not None and seg.disk_path.exists():
            log.warning("prefix cache: %s failed its checksum (damaged file); recomputing that "
                        "segment and removing the file", seg.disk_path)
            seg.disk_path.unlink(missing_ok=True)
        self._memory.pop(seg.hash, None)

    def _live_prefix(self, ns: str, usable: list[int]):
        if self.live is None or self.live[0] != ns:
            return None
        _, ids, state, saved = self.live
        n = 0
        for a, b in zip(ids, usable):
            if a != b:
                break
            n += 1
        if n == 0 or n < state.evicted:  # tiered: tokens before `evicted` have left the GPU ring
            return None
        self.live = None  # the caller now owns it: it appends after the shared prefix
        # Saved segments the caller will write into were views of the state's rows until their
        # files were written: wait for those writes (the files take the rows as they are now),
        # and forget a segment whose file could not be written (its rows are about to change).
        size = self.settings.segment_size
        for h, seg, write in saved:
            if seg.start + size > n:
                _wait(write)
                if seg.disk_path is None and self._memory.get(h) is seg:
                    del self._memory[h]
        return state, n

    def save(self, doc_key: str, prompt_ids: Sequence[int], state) -> int:
        """Cache the full segments of `state` that hold prompt_ids; returns how many are new.

        The state's tokens must start with prompt_ids (it may hold more, e.g. the answer).
        Saved segments become shared: the state keeps reading them, and writes elsewhere.
        """
        if state.settings.cache_key() != self.settings.cache_key():
            raise ValueError("the state was built under other engine settings than this cache")
        ns = self.namespace(doc_key)
        size = self.settings.segment_size
        n = min(len(prompt_ids), state.num_tokens)
        saved = []
        if self.keep_live:
            self.live = (ns, tuple(prompt_ids[:n]), state, saved)
        new = 0
        for i, h in enumerate(chain_hashes(ns, list(prompt_ids[:n]), size)):
            ids = tuple(prompt_ids[i * size:(i + 1) * size])
            if self._lookup(h, ns, ids) is not None:
                continue
            try:
                seg = state.export_segment(i)
            except ValueError:  # tiered: the segment already left the GPU; it stays uncached
                continue
            seg.shared, seg.hash, seg.token_ids = True, h, ids
            meta = {"namespace": ns, "token_ids": json.dumps(list(ids)), **segment_metadata(seg)}
            saved.append((h, seg, self._write(self._path(h), seg, meta)))
            self._remember(h, seg)
            new += 1
        self._submit(self._trim_disk)
        if not self.background:
            self.flush()
        return new

    # --- writes --------------------------------------------------------------------------------
    @property
    def background(self) -> bool:
        """Files are written by a background thread when the states are on a GPU: an 8B model's
        128K-token document is 16 GiB of segments, which would hold the answer back ~25 s."""
        return self.keep_live

    def _submit(self, fn, *args):
        if self._writer is None:
            import atexit
            from concurrent.futures import ThreadPoolExecutor

            self._writer = ThreadPoolExecutor(1, thread_name_prefix="docqa-kv-write")
            atexit.register(self.flush)  # a process that answered still finishes its writes
        future = self._writer.submit(fn, *args)
        self._pending.append(future)
        return future

    def _write(self, path: Path, seg: Segment, meta: dict):
        return self._submit(self._write_now, path, seg, meta)

    def _write_now(self, path: Path, seg: Segment, meta: dict) -> None:
        """Write the segment's file; where files cannot be written (a cache folder that is a file
        or read-only, a full disk) say so once and go on: the cache is an optimisation, and the
        segment stays in memory (a GPU state's: until that state's rows are written again)."""
        tensors = segment_tensors(seg)
        if tensors["k"].device.type == "cuda":  # copied out through pinned buffers reused file after file
            tensors = self._to_host(tensors)
        try:
            write_segment_file(path, tensors, meta, seg.checksum)
        except OSError as e:
            self._cannot_write(e)
            return
        seg.disk_path = path
        if self.background:  # views of a state's rows: the file is the cache's copy from now on
            seg.k = seg.v = seg.kmin = seg.kmax = seg.kmean = None

    def _cannot_write(self, e: OSError) -> None:
        if self.write_error is None:
            self.write_error = f"{e.strerror or e}: {e.filename or self.cache_dir}"
            log.warning("prefix cache: cannot write KV files under %s (%s); answers go on without "
                        "keeping this document's KV on disk", self.cache_dir, self.write_error)

    def _to_host(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in tensors.items():
            n = t.numel() * t.element_size()
            buf = self._pinned.get(name)
            if buf is None or buf.numel() < n:
                buf = self._pinned[name] = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            out[name] = buf[:n].view(t.dtype).view(t.shape)
            out[name].copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return out

    def flush(self) -> None:
        """Wait until every segment file submitted so far is on disk (errors re-raised)."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    # --- tiers ---------------------------------------------------------------------------------

    def _lookup(self, h: str, ns: str, ids: tuple[int, ...]) -> Segment | None:
        seg = self._memory.get(h)
        if seg is not None:
            if seg.token_ids != ids:
                self.misses += 1
                return None
            self._memory.move_to_end(h)
            self.hits_memory += 1
            return seg
        seg = self._read(h, ns, ids)
        if seg is None:
            self.misses += 1
            return None
        self.hits_disk += 1
        self._remember(h, seg)
        return seg

    def _read(self, h: str, ns: str, ids: tuple[int, ...]) -> Segment | None:
        """The segment of file h, known by its header only: the state that adopts it reads the
        tensors and checks them against the header's checksum (a damaged file is then
        recomputed, never served: `_damaged`)."""
        path = self._path(h)
        header = read_header(path)
        if header is None:
            return None
        meta = header[0]
        try:
            if meta.get("namespace") != ns or tuple(json.loads(meta["token_ids"])) != ids:
                return None
            if CHECKSUM_KEY not in meta:  # written before files carried one: made room for the new one
                path.unlink(missing_ok=True)
                return None
            start, size, length = int(meta["start"]), int(meta["size"]), int(meta["length"])
        except (KeyError, ValueError):  # a foreign file: a miss, never an error
            return None
        try:
            os.utime(path)  # disk LRU is by last use, recorded as mtime (atime may be off)
        except OSError:  # a read-only cache: still readable
            pass
        return Segment(start=start, size=size, length=length, disk_path=path, shared=True, hash=h, token_ids=ids,
                       checksum=meta[CHECKSUM_KEY])

    def _remember(self, h: str, seg: Segment) -> None:
        self._memory[h] = seg
        self._memory.move_to_end(h)
        while len(self._memory) > self.memory_segments:
            _, old = self._memory.popitem(last=False)
            # Live states keep their reference; the cache only stops pinning the tensors.
            if old.disk_path is not None and old.disk_path.exists():
                old.k = old.v = None

    def _trim_disk(self) -> None:
        stale = time.time() - STALE_TMP_S
        files = []
        try:
            for p in self.cache_dir.glob("*/*.tmp"):  # left by a writer killed mid-write
                try:
                    if p.stat().st_mtime < stale:
                        p.unlink()
                except OSError:  # another process removed it first
                    pass
            for p in self.cache_dir.glob("*/*.safetensors"):
                try:
                    st = p.stat()
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, p))
        except OSError as e:  # a cache folder that cannot be listed
            self._cannot_write(e)
            return
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.disk_bytes:
                break
            if p.stem in self._memory:  # states may still page this one in
                continue
            try:
                p.unlink(missing_ok=True)
            except OSError as e:
                self._cannot_write(e)
                return
            total -= size


def _wait(write) -> None:
    """Until a segment file's write is over (its errors are the writer's: `_write_now`)."""
    if write is not None:
        write.exception()
