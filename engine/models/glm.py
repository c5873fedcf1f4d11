"""GLM decoders: GLM-4 (`glm4`, dense), GLM-4.5/4.6 (`glm4_moe`), GLM-4.7-Flash
(`glm4_moe_lite`: MLA + MoE) and GLM-5 (`glm_moe_dsa`: MLA + DSA + MoE).

One model class, parts chosen by the config: GQA attention through the engine's KV states
(partial / interleaved RoPE is the state's `Rope`, engine/rope.py) or MLA through
`MLAKVState`; a dense SwiGLU MLP or the MoE (engine/models/moe.py); GLM-4's extra norms after
attention and MLP. Batch 1, tokens as a flat [T] sequence, the same forward signature as
`LlamaModel` so `Engine.generate` drives both.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..config import ModelConfig
from ..dense import DenseKVState
from ..mla_state import MLAKVState
from ..rope import Rope
from .llama import Attention, LlamaModel, RMSNorm
from .mla import MLAttention
from .moe import DenseMLP, MoE

_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT_RE = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.mla = config.mla is not None
        self.input_layernorm = RMSNorm(config.hidden, config.rms_eps)
        self.self_attn = MLAttention(config, layer) if self.mla else Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_eps)
        sparse = config.moe is not None and config.moe.layer_types[layer] == "sparse"
        self.mlp = MoE(config) if sparse else DenseMLP(config.hidden, config.intermediate)
        if config.post_norms:
            self.post_self_attn_layernorm = RMSNorm(config.hidden, config.rms_eps)
            self.post_mlp_layernorm = RMSNorm(config.hidden, config.rms_eps)
        self.post_norms = config.post_norms

    def forward(self, x, state, positions, indices=None):
        h = self.input_layernorm(x)
        if self.mla:
            h, indices = self.self_attn(h, state, positions, indices)
        else:
            h = self.self_attn(h, state, positions)
        if self.post_norms:
            h = self.post_self_attn_layernorm(h)
        x = x + h
        h = self.mlp(self.post_attention_layernorm(x))
        if self.post_norms:
            h = self.post_mlp_layernorm(h)
        return x + h, indices


class GlmModel(nn.Module):
    """Parameter names follow Hugging Face's without the `model.` prefix; routed experts are
    stacked per layer (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding.from_pretrained(torch.empty(0, config.hidden))
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        from .llama import Linear

        self.lm_head = Linear(config.hidden, config.vocab)
        self.rope = Rope(config)
        self.decode_weights = {"mode": "fp32", "bytes": 0}  # no decode-only copies for GLM yet
        self.mtp_weights: dict[str, torch.Tensor] = {}  # layers past n_layers (engine/models/mtp.py)

    def new_state(self, capacity: int = 1024, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu"):
        """The KV state this architecture attends through (MLA latents, or dense K/V)."""
        if self.config.mla is not None:
            return MLAKVState(self.config, self.rope, dtype=dtype, device=device)
        return DenseKVState(self.config, self.rope, capacity=capacity, dtype=dtype, device=device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, state, *, last_only: bool = False,
                chunk_size: int = 1024, argmax_only: bool = False, on_chunk=None,
                return_hidden: bool = False):
        """As `LlamaModel.forward`; return_hidden also returns the final hidden states of every
        row (after the output norm, as MTP layers take them), whatever last_only says."""
        input_ids = input_ids.reshape(-1)
        n = input_ids.shape[0]
        outs, hiddens = [], []
        for start in range(0, n, chunk_size):
            hidden = self.norm(self._forward_chunk(input_ids[start:start + chunk_size], state))
            if on_chunk is not None:
                on_chunk(min(start + chunk_size, n), n)
            if return_hidden:
                hiddens.append(hidden)
            if last_only and start + chunk_size < n:
                continue
            outs.append(self.lm_head(hidden[-1:] if last_only else hidden))
        logits = outs[0] if len(outs) == 1 else torch.cat(outs)
        return (logits, torch.cat(hiddens)) if return_hidden else logits

    def _forward_chunk(self, ids: torch.Tensor, state) -> torch.Tensor:
        t = ids.shape[0]
        positions = torch.arange(state.num_tokens, state.num_tokens + t, device=ids.device)
        x = self.embed_tokens(ids)
        indices = None
        for block in self.layers:
            x, indices = block(x, state, positions, indices)
        state.commit(t)
        return x

    def load_weights(self, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
        """HF-named tensors -> parameters (see `normalise_weights`); MTP layers (index >=
        n_layers) are kept aside in `mtp_weights`."""
        if self.config.fp8_block is not None:  # CPU: dequantise once, at load (models/fp8.py)
            from .fp8 import dequantize_checkpoint

            weights = dequantize_checkpoint(weights, self.config.fp8_block)
        main, self.mtp_weights = normalise_weights(weights, self.config.n_layers)
        LlamaModel.load_weights(self, main, dtype=dtype)


def normalise_weights(weights: dict[str, torch.Tensor], n_layers: int):
    """(decoder tensors, MTP tensors): per-expert matrices stacked into the experts' 3-D
    tensors, GLM-4's fused gate_up_proj split, layers >= n_layers set apart as MTP."""
    main: dict[str, torch.Tensor] = {}
    mtp: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in weights.items():
        m = _LAYER_RE.fullmatch(name)
        if m and int(m.group(1)) >= n_layers:
            mtp[name] = t
            continue
        e = _EXPERT_RE.fullmatch(name)
        if e:
            experts.setdefault(e.group(1), {}).setdefault(int(e.group(2)), {})[e.group(3)] = t
        elif m and m.group(2) == "mlp.gate_up_proj.weight":
            gate, up = t.chunk(2, dim=0)
            prefix = name.removesuffix("gate_up_proj.weight")
            main[prefix + "gate_proj.weight"], main[prefix + "up_proj.weight"] = gate, up
        else:
            main[name] = t
    for prefix, per in experts.items():
        ids = sorted(per)
        main[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat((per[i]["gate"], per[i]["up"])) for i in ids])
        main[prefix + ".down_proj"] = torch.stack([per[i]["down"] for i in ids])
    return main, mtp


def assign_strict(module: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Set every parameter of `module` from `state` (same names and shapes, nothing left over)."""
    own = dict(module.named_parameters(remove_duplicate=False))
    missing, unexpected = own.keys() - state.keys(), state.keys() - own.keys()
    if missing or unexpected:
        raise KeyError(f"checkpoint does not fit the model: missing {sorted(missing)[:5]}, "
                       f"unexpected {sorted(unexpected)[:5]}")
    for name, param in own.items():
        t = state[name]
        if tuple(t.shape) != tuple(param.shape) and name != "embed_tokens.weight":
            raise KeyError(f"tensor {name} has shape {tuple(t.shape)}, the config implies "
                           f"{tuple(param.shape)}")
        module_name, _, attr = name.rpartition(".")
        setattr(module.get_submodule(module_name), attr,
                nn.Parameter(t.to(dtype).contiguous(), requires_grad=False))
