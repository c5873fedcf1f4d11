"""The embedded LLM engine: checkpoints, tokenizer, model forward, KV states, generation.

Knows nothing of documents."""

from .config import CheckpointError, ModelConfig
from .dense import DenseKVState
from .generate import Engine, GenerationResult
from .rope import Rope

__all__ = ["CheckpointError", "DenseKVState", "Engine", "GenerationResult", "ModelConfig", "Rope"]
