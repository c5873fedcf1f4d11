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
at most `memory_segments`) and on disk under `cache_dir` as one safetensors file per segment
(LRU by access time, at most `disk_bytes`). Every save writes through to disk, so another
process asking about the same document loads the prefix from there.

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
from safetensors import safe_open

from .config import ModelConfig
from .kv_cache import Segment, segment_checksum, write_segment_file
from .rope import Rope
from .settings import EngineSettings
from .sparse_state import SparseKVState


log = logging.getLogger(__name__)

# A `*.tmp` file older than this was left by a writer that died (a write takes seconds).
STALE_TMP_S = 3600


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "docqa" / "kv"


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
    """Caches the full segments of document prompts for one model and one engine setting."""

    def __init__(
        self,
        config: ModelConfig,
        model_hash: str,
        settings: EngineSettings | None = None,
        rope: Rope | None = None,
        *,
        cache_dir: str | Path | None = None,
        memory_segments: int = 64,
        disk_bytes: int = 20 * 2**30,
        device: torch.device | str = "cpu",
    ):
        self.config, self.model_hash = config, model_hash
        self.settings = settings or EngineSettings()
        self.rope = rope if rope is not None else Rope(config)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.memory_segments, self.disk_bytes = memory_segments, disk_bytes
        self.device = device
        self._memory: OrderedDict[str, Segment] = OrderedDict()  # chain hash -> segment, LRU first
        self.hits_memory = self.hits_disk = self.misses = 0

    # --- keys ------------------------------------------------------------------------------

    def namespace(self, doc_key: str) -> str:
        shape = (self.config.n_layers, self.config.n_kv_heads, self.config.head_dim)
        return json.dumps([doc_key, self.model_hash, self.settings.cache_key(), shape])

    def _path(self, h: str) -> Path:
        return self.cache_dir / h[:2] / f"{h}.safetensors"

    # --- API -------------------------------------------------------------------------------

    @classmethod
    def for_engine(cls, engine, settings: EngineSettings | None = None, **kw) -> "PrefixCache":
        """A cache for a loaded `Engine`, keyed by the sha256 of its checkpoint file(s)."""
        from .default_model import file_sha256

        path = Path(engine.checkpoint.path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        model_hash = hashlib.sha256("".join(file_sha256(f) for f in files).encode()).hexdigest()
        kw.setdefault("device", engine.device)
        return cls(engine.config, model_hash, settings, engine.rope, **kw)

    def new_state(self) -> SparseKVState:
        return SparseKVState(self.config, self.settings, self.rope, device=self.device)

    def get_state(self, doc_key: str, prompt_ids: Sequence[int]) -> tuple[SparseKVState, int]:
        """A fresh state holding the longest cached prefix of prompt_ids, and its length.

        Only full segments are reused, and never the whole prompt: the last prompt token is
        always left to prefill, since generation needs its logits.
        """
        ns = self.namespace(doc_key)
        usable = list(prompt_ids[: max(0, len(prompt_ids) - 1)])
        segments: list[Segment] = []
        for i, h in enumerate(chain_hashes(ns, usable, self.settings.segment_size)):
            ids = tuple(usable[i * self.settings.segment_size:(i + 1) * self.settings.segment_size])
            seg = self._lookup(h, ns, ids)
            if seg is None:
                break
            segments.append(seg)
        state = self.new_state()
        if segments:
            state.cache.adopt(segments)
        return state, state.num_tokens

    def save(self, doc_key: str, prompt_ids: Sequence[int], state: SparseKVState) -> int:
        """Cache the full segments of `state` that hold prompt_ids; returns how many are new.

        The state's tokens must start with prompt_ids (it may hold more, e.g. the answer).
        Saved segments become shared: the state keeps reading them, and writes elsewhere.
        """
        if state.settings.cache_key() != self.settings.cache_key():
            raise ValueError("the state was built under other engine settings than this cache")
        ns = self.namespace(doc_key)
        size = self.settings.segment_size
        n = min(len(prompt_ids), state.num_tokens)
        new = 0
        for i, h in enumerate(chain_hashes(ns, list(prompt_ids[:n]), size)):
            seg = state.cache.segments[i]
            if seg.hash == h:
                continue
            if self._lookup(h, ns, tuple(prompt_ids[i * size:(i + 1) * size])) is None:
                ids = tuple(prompt_ids[i * size:(i + 1) * size])
                state.cache._load(seg)
                seg.shared, seg.hash, seg.token_ids = True, h, ids
                meta = {"namespace": ns, "token_ids": json.dumps(list(ids))}
                write_segment_file(self._path(h), seg, meta)
                seg.disk_path = self._path(h)
                self._remember(h, seg)
                new += 1
        self._trim_disk()
        return new

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
        path = self._path(h)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                meta = f.metadata()
                if meta.get("namespace") != ns or tuple(json.loads(meta["token_ids"])) != ids:
                    return None
                t = {name: f.get_tensor(name) for name in f.keys()}
        except Exception:  # missing, truncated or foreign file: a miss, never an error
            return None
        # Every disk hit checks the tensor bytes (K/V included, though they are paged in later:
        # the OS keeps them cached): a damaged file is recomputed, never served.
        if meta.get("sha256") != segment_checksum(t):
            log.warning("prefix cache: %s failed its checksum (damaged file); recomputing that "
                        "segment and removing the file", path)
            path.unlink(missing_ok=True)
            return None
        del t["k"], t["v"]
        os.utime(path)  # disk LRU is by last use, recorded as mtime (atime may be off)
        size = int(meta["size"])
        # K/V stay on disk until a query reads them; descriptors (small) come in now.
        return Segment(start=int(meta["start"]), size=size, length=int(meta["length"]),
                       kmin=t["kmin"].to(self.device), kmax=t["kmax"].to(self.device),
                       kmean=t["kmean"].to(self.device), disk_path=path, shared=True, hash=h,
                       token_ids=ids)

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
        for p in self.cache_dir.glob("*/*.tmp"):  # left by a writer killed mid-write
            try:
                if p.stat().st_mtime < stale:
                    p.unlink()
            except OSError:  # another process removed or replaced it first
                pass
        files = []
        for p in self.cache_dir.glob("*/*.safetensors"):
            st = p.stat()
            files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.disk_bytes:
                break
            if p.stem in self._memory:  # states may still page this one in
                continue
            p.unlink(missing_ok=True)
            total -= size
