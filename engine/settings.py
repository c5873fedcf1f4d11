"""Engine settings: those that shape attention and the KV cache, and the environment.

Everything that changes what a cached key/value or descriptor means is part of `cache_key()`,
so two runs under different settings never share prefix-cache segments.

Every environment variable the engine reads (`DOCQA_MODEL`, `DOCQA_DEVICE`, `DOCQA_THREADS`,
`XDG_CACHE_HOME`) is read by a function at the end of this module, and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import DocqaError

POSITION_SCHEMES = ("true", "packed", "inflm")


@dataclass(frozen=True)
class EngineSettings:
    attention: str = "sparse"  # or "dense": exact attention over every key
    sink_tokens: int = 4
    window: int = 1024  # local window: query i always sees keys i-window+1 .. i
    block_size: int = 64  # routing granularity
    top_k: int = 16  # routed blocks per query chunk and kv head
    # "mean" (q . mean key) or "minmax" (upper bound of q.k over the block); mean routed the
    # passkey needle 2-4x more often (bench/results/passkey.md): the bound favours blocks
    # with wide per-channel ranges over blocks whose content matches.
    block_score: str = "mean"
    segment_size: int = 2048  # tokens per cache segment (unit of tiering and prefix caching)
    chunk_size: int = 512  # prefill chunk (bounds activation memory)
    # Queries that share one routing decision (a smaller value lets the question's last tokens
    # pick their own blocks; 32 was measured in bench/results/passkey.md: no better, 10x slower).
    route_chunk: int = 512
    # The last route_tail queries of each attend call (prefill chunk) route on their own: for a
    # prompt's final chunk these are the question and the answer prefix, which otherwise share
    # the routing of hundreds of document queries; one extra routing per chunk. 0 = off.
    route_tail: int = 16
    # Of the top_k blocks, route_shared are read by every kv head of the layer: the blocks some
    # head singles out most clearly (per-head standardised scores, max over heads). A needle
    # that one head finds is then read by all of them (bench/results/passkey.md: with the
    # needle's blocks forced into every head, 4/5 at 16K instead of 2/5). 0 = per head only.
    route_shared: int = 0
    # Positions that distant (routed) blocks get, so contexts longer than the model's trained
    # length stay inside the positions it knows:
    #   true   - every key at its real position (exact, but distances grow without bound)
    #   packed - sinks, the routed blocks in order, then the window: positions are indices into
    #            that compressed sequence (equals true whenever every block is routed)
    #   inflm  - InfLLM-style: all routed tokens at one position just outside the window, sinks
    #            at their own positions, window at true relative positions
    positions: str = "packed"
    # Below this many keys the sparse state attends densely (same result, less bookkeeping);
    # 0 forces the routed path everywhere (tests use that to check it equals dense).
    dense_below: int = 2048
    live_segments: int = 0  # segments kept as live tensors per state; 0 = no limit
    kv_dtype: str = "float32"  # storage dtype of the cache: float32, bfloat16, float16

    def __post_init__(self):
        assert self.attention in ("sparse", "dense"), self.attention
        assert self.positions in POSITION_SCHEMES, self.positions
        assert self.block_score in ("minmax", "mean"), self.block_score
        assert self.block_size > 0 and self.window > 0 and self.top_k >= 0 and self.sink_tokens >= 0
        assert self.segment_size % self.block_size == 0, "segments hold whole blocks"
        assert self.chunk_size > 0 and self.route_chunk > 0 and self.live_segments >= 0
        assert self.route_tail >= 0 and 0 <= self.route_shared <= self.top_k
        assert self.kv_dtype in ("float32", "bfloat16", "float16"), self.kv_dtype

    @property
    def budget(self) -> int:
        """Keys a query can see at most: sinks + routed blocks + window."""
        return self.sink_tokens + self.top_k * self.block_size + self.window

    def cache_key(self) -> str:
        """Hash of the fields that change what a cached segment holds.

        Routing knobs (window, sinks, top_k, score method) only change how stored keys are
        read, so a document read once serves every routing budget; block size, segment size,
        KV dtype and the positions scheme (raw vs rotated descriptors) change the bytes.
        """
        fields = asdict(self)
        for runtime_only in (
            "chunk_size", "route_chunk", "route_tail", "route_shared", "dense_below", "live_segments", "attention", "top_k", "window", "sink_tokens",
            "block_score",
        ):
            fields.pop(runtime_only)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


# -- the environment: every DOCQA_* / XDG_* variable the engine reads is read here ---------


def env_model() -> str | None:
    """`DOCQA_MODEL`: the checkpoint `Engine.load(None)` loads (else the default model)."""
    return os.environ.get("DOCQA_MODEL") or None


def env_device() -> str | None:
    """`DOCQA_DEVICE`: cpu, cuda, cuda:N or auto, when no device is given."""
    value = os.environ.get("DOCQA_DEVICE") or None
    if value is not None and not re.fullmatch(r"\s*(cpu|auto|cuda(:\d+)?)\s*", value.lower()):
        raise DocqaError(f"DOCQA_DEVICE must be cpu, cuda, cuda:N or auto, not {value!r}")
    return value


def env_threads() -> int | None:
    """`DOCQA_THREADS`: CPU threads for torch (1 or more); None: chosen from the load."""
    value = os.environ.get("DOCQA_THREADS")
    if not value:
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise DocqaError(f"DOCQA_THREADS must be a whole number of threads, 1 or more, not {value!r}")
    return threads


def check_environment() -> None:
    """Read every engine variable once, so a bad value is one line when a command starts,
    not an error minutes later when a model first runs (the CLI calls this at start)."""
    env_device()
    env_threads()


def cache_home() -> Path:
    """`$XDG_CACHE_HOME` (else ~/.cache): the prefix cache's KV files and the default model's
    checksum live under its `docqa/`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
