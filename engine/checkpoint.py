"""Checkpoints: a GGUF file or a Hugging Face directory, turned into a ModelConfig, HF-named
float tensors, and the metadata the tokenizer and chat template need."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..kernels.linear.gguf_cpu import BLOCKS, GGUFMatrix
from .config import CheckpointError, ModelConfig
from .gguf_loader import GGUFFile

_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK_TO_HF = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 has a norm on each side of attention and of the MLP; HF's names for them.
_GGUF_GEMMA3_TO_HF = {
    **_GGUF_BLOCK_TO_HF,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation for llama-arch models.

    llama.cpp's converter reorders each head's rows from HF's rotate_half layout (first half,
    second half) to interleaved pairs (GGML's "normal" RoPE): reshape(heads, 2, D/2) ->
    swap -> (heads, D/2, 2). Reading the rows as (heads, D/2, 2) and swapping back restores HF.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class Checkpoint:
    path: Path
    format: str  # "gguf" | "hf"
    config: ModelConfig
    metadata: dict[str, Any] = field(repr=False)  # GGUF key/values, or {} for HF dirs
    _gguf: GGUFFile | None = field(default=None, repr=False)

    def tensors(self, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                *, quantized: bool = False) -> dict[str, torch.Tensor | GGUFMatrix]:
        """All weights (quantised ones dequantised) in `dtype` on `device`, under Hugging Face
        names. An HF checkpoint is read straight onto the device: an 8B bf16 model on a GPU
        never passes through 32 GB of host float32. quantized=True (GGUF, CPU): the matrices the
        CPU kernel reads stay GGUFMatrix views of the mapped file (engine/gguf_weights.py)."""
        if self.format == "gguf":
            return {n: t if isinstance(t, GGUFMatrix) else t.to(device, dtype)
                    for n, t in _gguf_tensors(self._gguf, self.config, quantized).items()}
        return _hf_tensors(self.path, dtype, torch.device(device))

    def parameter_count(self) -> int:
        """How many weights the checkpoint holds, from its headers (no tensor is read)."""
        if self.format == "gguf":
            return sum(math.prod(t.shape) for t in self._gguf.tensors.values())
        from safetensors import safe_open

        total = 0
        for f in sorted(self.path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                total += sum(math.prod(sf.get_slice(name).get_shape()) for name in sf.keys())
        return total


def open_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return open_checkpoint(ggufs[0])
            raise CheckpointError(f"{path} has no config.json (nor a single .gguf file)")
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read {cfg_file}: {e}") from None
        _check_shards(path)
        return Checkpoint(path, "hf", ModelConfig.from_hf(cfg), {})
    if not path.exists():
        raise CheckpointError(f"model file {path} does not exist")
    gf = GGUFFile(path)
    meta = gf.metadata
    arch = meta.get("general.architecture")
    factors = None
    if "rope_freqs.weight" in gf.tensors:
        factors = tuple(float(x) for x in gf.tensors["rope_freqs.weight"].to_numpy())
    config = ModelConfig.from_gguf(
        meta,
        has_output="output.weight" in gf.tensors,
        has_qkv_bias="blk.0.attn_q.bias" in gf.tensors,
        rope_freq_factors=factors,
    )
    if arch is None:
        raise CheckpointError(f"{path} has no general.architecture")
    return Checkpoint(path, "gguf", config, meta, gf)


def _check_shards(path: Path) -> None:
    """An HF checkpoint holds every weight file its index names and at least one: a missing
    shard is found here, before loading, not as a missing tensor deep inside a model."""
    if not any(path.glob("*.safetensors")):
        raise CheckpointError(f"checkpoint {path} is incomplete: it has no *.safetensors weight files")
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError(f"cannot read {index}: {type(e).__name__}: {e}") from None
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise CheckpointError(f"checkpoint {path} is incomplete: {index.name} lists {len(shards)} weight "
                                  f"files and {len(missing)} of them are missing ({shown})")


def _gguf_entries(gf: GGUFFile, config: ModelConfig):
    """(GGUF name, HF name, tensor, heads to un-permute its rows by or None) per weight."""
    # Only llama.cpp's LlamaModel converter permutes Q/K; Qwen2/3 files keep the HF layout.
    permuted = config.arch in ("llama", "mistral")
    block_names = _GGUF_GEMMA3_TO_HF if config.arch == "gemma3" else _GGUF_BLOCK_TO_HF
    for name, t in gf.tensors.items():
        if name == "rope_freqs.weight":
            continue
        m = _BLOCK_RE.fullmatch(name)
        if m:
            suffix = m.group(2)
            if suffix not in block_names:
                raise CheckpointError(f"unexpected tensor {name} in {gf.path}")
            hf = f"model.layers.{m.group(1)}.{block_names[suffix]}"
        elif name in _GGUF_TO_HF:
            hf = _GGUF_TO_HF[name]
        else:
            raise CheckpointError(f"unexpected tensor {name} in {gf.path}")
        heads = None
        if permuted and m and m.group(2).startswith(("attn_q.", "attn_k.")):
            heads = config.n_heads if m.group(2).startswith("attn_q.") else config.n_kv_heads
        yield name, hf, t, heads


def _gguf_tensors(gf: GGUFFile, config: ModelConfig, quantized: bool = False) -> dict[str, torch.Tensor | GGUFMatrix]:
    out = {}
    for _, hf, t, heads in _gguf_entries(gf, config):
        if quantized and t.qtype in BLOCKS and len(t.shape) == 2:
            rows = t.raw.reshape(t.shape[0], -1)  # a view of the mapped file
            if heads:  # whole rows move, so the blocks are re-ordered as they are (a small copy)
                rows = np.ascontiguousarray(unpermute_rope_rows(rows, heads))
            out[hf] = GGUFMatrix(torch.from_numpy(rows), int(t.qtype), t.shape[1])
            continue
        arr = t.to_numpy()
        if heads:
            arr = unpermute_rope_rows(arr, heads)
        out[hf] = torch.from_numpy(np.array(arr, dtype=np.float32, copy=not arr.flags.writeable))
    return out


def _hf_tensors(path: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} has no *.safetensors files")
    out = {}
    for f in files:
        # safe_open memory-maps the file; tensors already in `dtype` are not copied again here.
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            for name in sf.keys():
                t = sf.get_tensor(name)
                # FP8 weights stay 1-byte here, their block scales fp32; the model applies them.
                keep = t.dtype in (dtype, torch.float8_e4m3fn) or name.endswith("_scale_inv")
                out[name] = t if keep else t.to(dtype)
    return out


def load_model(path: str | Path, *, dtype: torch.dtype = torch.float32, decode_weights: str = "fp32"):
    """(model, checkpoint): the model's parameters are the checkpoint's tensors themselves.

    decode_weights: "fp32" (the reference) dequantises everything; "auto" (Engine.load's default)
    keeps a GGUF's quantised matrices as stored where the CPU kernel is available
    (engine/gguf_weights.py)."""
    from .config import GLM_ARCHS
    from .gguf_weights import keeps_quantized, resolve_mode, summary
    from .models.llama import LlamaModel

    mode = resolve_mode(decode_weights)
    ckpt = open_checkpoint(path)
    if ckpt.config.arch in GLM_ARCHS:
        from .models.glm import GlmModel

        model = GlmModel(ckpt.config)
    elif ckpt.config.arch == "gemma3":
        from .models.gemma3 import Gemma3Model

        model = Gemma3Model(ckpt.config)
    else:
        model = LlamaModel(ckpt.config)
    # Only the Llama family runs on GGUF blocks; GLM and Gemma 3 load dequantised.
    quantized, reason = keeps_quantized(mode, ckpt, dtype) if isinstance(model, LlamaModel) else (False, "")
    try:
        model.load_weights(ckpt.tensors(quantized=quantized), dtype=dtype)
    except KeyError as e:  # the models' strict name and shape checks
        raise CheckpointError(f"checkpoint {ckpt.path} does not hold the weights its config describes: "
                              f"{e.args[0] if e.args else e}") from None
    model.eval()
    if isinstance(model, LlamaModel):
        model.decode_weights = summary(model, reason)
    return model, ckpt
