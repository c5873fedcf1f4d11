"""The shape of a decoder-only checkpoint, read from a GGUF file or a Hugging Face config.json.

Other parts of the engine (KV states, the sparse router, the prefix cache) build themselves from
a `ModelConfig`; treat its fields as a stable contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import DocqaError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "glm4", "glm4_moe", "glm4_moe_lite",
                   "glm_moe_dsa", "gemma3")
GLM_ARCHS = ("glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa")  # engine/models/glm.py


class CheckpointError(DocqaError):
    """A checkpoint that cannot be used; the message is one complete line for the user."""


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2 style, GLM-4.7-Flash, GLM-5)."""
    q_lora_rank: int | None  # None: q comes from one q_proj
    kv_lora_rank: int  # width of the cached latent
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoESpec:
    """Routed + shared experts with the DeepSeek-V3 / GLM-4.5 sigmoid gate."""
    n_routed: int
    n_shared: int
    top_k: int
    n_group: int
    topk_group: int
    routed_scaling: float
    norm_topk_prob: bool
    intermediate: int  # per expert
    layer_types: tuple[str, ...]  # "dense" | "sparse" per layer


@dataclass(frozen=True)
class DSASpec:
    """DeepSeek Sparse Attention: a lightning indexer picks `topk` tokens per query; "shared"
    layers reuse the top-k of the last "full" layer before them (GLM-5.2 IndexShare)."""
    topk: int
    head_dim: int
    n_heads: int
    indexer_types: tuple[str, ...]


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
    # GLM families (engine/models/glm.py); the defaults leave the Llama family as it was.
    rotary_dim: int | None = None  # RoPE on the first rotary_dim dims of a head (None: all)
    rope_interleaved: bool = False  # pairs (x0, x1), (x2, x3).. instead of rotate_half halves
    post_norms: bool = False  # GLM-4: RMSNorm after attention and after the MLP too
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    dsa: DSASpec | None = None
    mtp_layers: int = 0  # next-token-prediction layers stored after the decoder's
    fp8_block: tuple[int, int] | None = None  # FP8 e4m3 weights with one scale per block
    # Gemma 3 (engine/models/gemma3.py): sliding-window layers with their own RoPE base, every
    # `global_every`-th layer global.
    sliding_window: int | None = None
    global_every: int = 0
    rope_local_theta: float | None = None

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
        if model_type in GLM_ARCHS:
            return _glm_from_hf(cls, cfg)
        if model_type == "gemma3":
            raise CheckpointError("gemma3 runs from its GGUF file; its HF directory is not supported")
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
            fp8_block=_fp8_block(cfg.get("quantization_config")),
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], *, has_output: bool, has_qkv_bias: bool,
                  rope_freq_factors: tuple[float, ...] | None = None) -> "ModelConfig":
        """From GGUF metadata (llama.cpp key names) plus facts only the tensor list tells."""
        arch = meta.get("general.architecture")
        gguf_archs = [a for a in SUPPORTED_ARCHS if a not in GLM_ARCHS]  # GLM: HF directories only
        if arch not in gguf_archs:
            raise CheckpointError(
                f"unsupported GGUF architecture {arch!r}; supported: {', '.join(gguf_archs)}"
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
            qk_norm=arch in ("qwen3", "gemma3"),
            rope_scaling=scaling,
            rope_freq_factors=rope_freq_factors,
            # llama.cpp fixes these for gemma3 rather than storing them: 10000 for local layers,
            # one global layer in six.
            sliding_window=int(get("attention.sliding_window")) if arch == "gemma3" else None,
            global_every=6 if arch == "gemma3" else 0,
            rope_local_theta=10000.0 if arch == "gemma3" else None,
        )


def _glm_from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
    """GLM-4 (dense), GLM-4.5/4.6 (MoE), GLM-4.7-Flash (MLA + MoE), GLM-5 (MLA + DSA + MoE), read
    as transformers 5.x reads them (its defaults where config.json is silent)."""
    arch = cfg["model_type"]
    n_layers = cfg["num_hidden_layers"]
    n_heads = cfg["num_attention_heads"]
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type != "default":
        raise CheckpointError(f"{arch}: rope type {rope_type!r} is not supported (only default)")
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    mla = moe = dsa = None
    if arch in ("glm4_moe_lite", "glm_moe_dsa"):
        mla = MLASpec(q_lora_rank=cfg.get("q_lora_rank", 768 if arch == "glm4_moe_lite" else 2048),
                      kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
                      qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"])
        head_dim = mla.qk_rope_head_dim  # what RoPE turns; the latent has no heads
        n_kv = n_heads
        interleaved = arch == "glm_moe_dsa" or bool(cfg.get("rope_interleave", True))
        # GLM-5's rotary embedding ignores partial_rotary_factor; GLM-4.7-Flash's honours it.
        rotary = head_dim if arch == "glm_moe_dsa" else int(head_dim * (partial or 1.0))
    else:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
        n_kv = cfg.get("num_key_value_heads") or n_heads
        interleaved = arch == "glm4"
        rotary = int(head_dim * (0.5 if partial is None else partial))
    if arch != "glm4":
        dense_first = cfg.get("first_k_dense_replace", 1 if arch == "glm4_moe" else 3)
        types = cfg.get("mlp_layer_types")
        if types is None:
            if arch == "glm4_moe_lite":
                dense_first = 1
            n_dense = min(dense_first, n_layers)
            types = ["dense"] * n_dense + ["sparse"] * (n_layers - n_dense)
        moe = MoESpec(n_routed=cfg.get("n_routed_experts") or cfg.get("num_experts"),
                      n_shared=cfg.get("n_shared_experts", 1),
                      top_k=cfg["num_experts_per_tok"], n_group=cfg.get("n_group", 1),
                      topk_group=cfg.get("topk_group", 1),
                      routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
                      norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                      intermediate=cfg["moe_intermediate_size"], layer_types=tuple(types))
    if arch == "glm_moe_dsa":
        types = cfg.get("indexer_types")
        if types is None:  # the schedule transformers derives when config.json has no list
            pattern = cfg.get("index_topk_pattern")
            if pattern is not None:
                types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) \
                    else list(pattern)
            else:
                freq = max(cfg.get("index_topk_freq", 1), 1)
                offset = cfg.get("index_skip_topk_offset", 2)
                types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                         for i in range(n_layers)]
        if types[0] != "full":
            raise CheckpointError("glm_moe_dsa: the first layer must run its own indexer (\"full\")")
        dsa = DSASpec(topk=cfg.get("index_topk", 2048), head_dim=cfg.get("index_head_dim", 128),
                      n_heads=cfg.get("index_n_heads", 32), indexer_types=tuple(types))
    return cls(
        arch=arch,
        n_layers=n_layers,
        hidden=cfg["hidden_size"],
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        rope_theta=theta,
        max_position=cfg.get("max_position_embeddings", 131072),
        rms_eps=float(cfg.get("rms_norm_eps", 1.5625e-07 if arch == "glm4" else 1e-5)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", arch == "glm4")),
        qk_norm=bool(cfg.get("use_qk_norm", False)),
        rotary_dim=rotary,
        rope_interleaved=interleaved,
        post_norms=arch == "glm4",
        mla=mla, moe=moe, dsa=dsa,
        mtp_layers=int(cfg.get("num_nextn_predict_layers", 0) or 0),
        fp8_block=_fp8_block(cfg.get("quantization_config")),
    )


def _fp8_block(q: dict[str, Any] | None) -> tuple[int, int] | None:
    if not q:
        return None
    if q.get("quant_method") != "fp8" or "weight_block_size" not in q:
        raise CheckpointError(f"quantization {q.get('quant_method')!r} is not supported "
                              "(FP8 with weight_block_size is)")
    if q.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(f"FP8 format {q['fmt']!r} is not supported (e4m3 is)")
    bo, bi = q["weight_block_size"]
    return int(bo), int(bi)
