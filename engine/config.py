"""The shape of a decoder-only checkpoint, read from a GGUF file or a Hugging Face config.json.

Other parts of the engine (KV states, the sparse router, the prefix cache) build themselves from
a `ModelConfig`; treat its fields as a stable contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one complete line for the user."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" (also SmolLM2), "mistral", "qwen2", "qwen3"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    max_position: int  # the context length the model was trained for
    rms_eps: float
    tie_embeddings: bool
    qkv_bias: bool  # Qwen2: biases on q/k/v projections
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    # HF-style rope scaling dict ({"rope_type": "llama3", "factor": ..., ...}) or None.
    rope_scaling: dict[str, Any] | None = None
    # llama.cpp stores llama3 scaling as per-frequency divisors instead of the dict above.
    rope_freq_factors: tuple[float, ...] | None = field(default=None, repr=False)

    def __post_init__(self):
        assert self.arch in SUPPORTED_ARCHS, self.arch
        assert self.n_heads % self.n_kv_heads == 0, "GQA needs n_heads divisible by n_kv_heads"
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"
        if self.rope_freq_factors is not None:
            assert len(self.rope_freq_factors) == self.head_dim // 2

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face `config.json` (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_ARCHS:
            raise CheckpointError(
                f"unsupported architecture {model_type!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        n_heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        scaling = None
        if rope_type != "default":
            scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
            scaling["rope_type"] = rope_type
        return cls(
            arch=model_type,
            n_layers=cfg["num_hidden_layers"],
            hidden=cfg["hidden_size"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            rope_theta=theta,
            max_position=cfg.get("max_position_embeddings", 4096),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            rope_scaling=scaling,
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], *, has_output: bool, has_qkv_bias: bool,
                  rope_freq_factors: tuple[float, ...] | None = None) -> "ModelConfig":
        """From GGUF metadata (llama.cpp key names) plus facts only the tensor list tells."""
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise CheckpointError(
                f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )

        def get(key, default=None):
            return meta.get(f"{arch}.{key}", default)

        hidden = int(get("embedding_length"))
        n_heads = int(get("attention.head_count"))
        head_dim = int(get("attention.key_length") or get("rope.dimension_count") or hidden // n_heads)
        scaling = None
        scaling_type = get("rope.scaling.type")
        if scaling_type in ("linear", "yarn"):
            scaling = {"rope_type": scaling_type, "factor": float(get("rope.scaling.factor", 1.0))}
            if scaling_type == "yarn":
                scaling["original_max_position_embeddings"] = int(
                    get("rope.scaling.original_context_length"))
        vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
        return cls(
            arch=arch,
            n_layers=int(get("block_count")),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv") or n_heads),
            head_dim=head_dim,
            intermediate=int(get("feed_forward_length")),
            vocab=int(vocab),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            max_position=int(get("context_length", 4096)),
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            tie_embeddings=not has_output,
            qkv_bias=has_qkv_bias,
            qk_norm=arch == "qwen3",
            rope_scaling=scaling,
            rope_freq_factors=rope_freq_factors,
        )
