"""The embedded LLM engine: checkpoints, tokenizer, model forward, KV states, generation.

Knows nothing of documents. The names below are imported on first use (PEP 562), so that
`docqa.engine.config` (and with it the CLI) loads without importing torch.
"""

import importlib
import os

# Waiting OpenMP threads sleep instead of spinning: on a machine shared with other work a
# spinning thread takes a core from them and from our own descheduled threads (see
# generate.default_threads). libgomp reads this once, when torch loads it, so it is set here,
# before any engine module imports torch; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_LAZY = {"CheckpointError": ".config", "ModelConfig": ".config", "DenseKVState": ".dense",
         "Engine": ".generate", "GenerationResult": ".generate", "Rope": ".rope"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
