"""Llama-family decoder (Llama 2/3, Mistral, SmolLM2, Qwen2/2.5 with qkv bias, Qwen3 with q/k norm).

Batch 1, tokens as a flat [T] sequence. Attention itself lives in the KV state the caller passes
(see engine/attention.py); this file only assembles projections, norms and the MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import KVState
from ..config import ModelConfig
from ..rope import Rope
from ..gguf_weights import DecodeStep, GGUFMatrix, QuantEmbedding, QuantLinear


def _param(*shape: int) -> nn.Parameter:
    # torch.empty only reserves address space; the checkpoint's tensors replace it at load time,
    # so no init pass touches ~0.5 GB of memory (and no meta-device machinery is imported).
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__()
        self.weight = _param(d_out, d_in)
        self.bias = _param(d_out) if bias else None
        self.quant: QuantLinear | None = None  # the GGUF blocks instead of `weight` (engine/gguf_weights.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return self.quant(x)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)
        self.folded = False  # applied by the quantised product that follows it (engine/gguf_weights.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded:
            return x
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = Linear(config.hidden, q_size, bias=config.qkv_bias)
        self.k_proj = Linear(config.hidden, kv_size, bias=config.qkv_bias)
        self.v_proj = Linear(config.hidden, kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(q_size, config.hidden)
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.qkv: QuantLinear | None = None  # quantised q/k/v as one product
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, state: KVState, positions: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        if self.qkv is not None:
            q, k, v = self.qkv(x).split(self.qkv_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(t, self.n_heads, self.head_dim)
        k = k.view(t, self.n_kv_heads, self.head_dim)
        v = v.view(t, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = state.attend(self.layer, q, k, v, positions)
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(config.hidden, config.intermediate)
        self.up_proj = Linear(config.hidden, config.intermediate)
        self.down_proj = Linear(config.intermediate, config.hidden)
        self.gate_up: QuantLinear | None = None  # quantised gate/up as one product

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:  # silu(gate) * up inside the product
            return self.down_proj(self.gate_up(x))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden, config.rms_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, state: KVState, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), state, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Parameter names follow Hugging Face's without the `model.` prefix."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding.from_pretrained(torch.empty(0, config.hidden))
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.lm_head = Linear(config.hidden, config.vocab)
        self.decode_weights = {"mode": "fp32", "bytes": 0}  # fp32 or GGUF blocks (engine/gguf_weights.py)
        self.decode_step: DecodeStep | None = None  # a whole decode step in the compiled kernel

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, state: KVState, *, last_only: bool = False,
                chunk_size: int = 1024, argmax_only: bool = False,
                on_chunk=None) -> torch.Tensor:
        """Run `input_ids` [T] after what `state` already holds; logits [T, vocab] ([1, vocab]
        with last_only). Long inputs go through in chunks of `chunk_size` tokens, so activations
        stay bounded; ask for last_only there, or the logits alone are T x vocab floats.
        argmax_only: the caller uses only each row's argmax (the shared signature; this model
        computes every logit either way). on_chunk(done, total) after each chunk."""
        input_ids = input_ids.reshape(-1)
        outs = []
        for start in range(0, input_ids.shape[0], chunk_size):
            hidden = self._forward_chunk(input_ids[start:start + chunk_size], state)
            if on_chunk is not None:
                on_chunk(min(start + chunk_size, input_ids.shape[0]), input_ids.shape[0])
            if last_only and start + chunk_size < input_ids.shape[0]:
                continue
            if last_only:
                hidden = hidden[-1:]
            outs.append(self.lm_head(self.norm(hidden)))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _forward_chunk(self, ids: torch.Tensor, state: KVState) -> torch.Tensor:
        t = ids.shape[0]
        positions = torch.arange(state.num_tokens, state.num_tokens + t, device=ids.device)
        x = self.embed_tokens(ids)
        if t == 1 and self.decode_step is not None and getattr(state, "compiled", False):
            x = self.decode_step(x.contiguous(), state, positions)
            state.commit(1)
            return x
        for block in self.layers:
            x = block(x, state, positions)
        state.commit(t)
        return x

    def load_weights(self, weights: dict[str, torch.Tensor | GGUFMatrix], dtype: torch.dtype = torch.float32) -> None:
        """Assign HF-named tensors (`model.layers.0.self_attn.q_proj.weight`, ...) as parameters,
        without copying those already of `dtype`. Shapes and names are checked strictly. A matrix
        given as a GGUFMatrix stays quantised (engine/gguf_weights.py): its Linear computes on the
        blocks, q/k/v and gate/up fused into one product each where all of them are quantised."""
        if self.config.fp8_block is not None:  # CPU: FP8 matrices dequantised once, at load (models/fp8.py)
            from .fp8 import dequantize_checkpoint

            weights = dequantize_checkpoint(weights, self.config.fp8_block)
        state = {name.removeprefix("model."): t for name, t in weights.items()}
        if self.config.tie_embeddings or "lm_head.weight" not in state:
            state["lm_head.weight"] = state["embed_tokens.weight"]
        own = dict(self.named_parameters(remove_duplicate=False))
        missing, unexpected = own.keys() - state.keys(), state.keys() - own.keys()
        if missing or unexpected:
            raise KeyError(f"checkpoint does not fit the model: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")
        for name, param in own.items():
            t = state[name]
            want = tuple(param.shape) if name != "embed_tokens.weight" else (self.config.vocab, self.config.hidden)
            if tuple(t.shape) != want:
                raise KeyError(f"tensor {name} has shape {tuple(t.shape)}, the config implies {want}")
            module_name, _, attr = name.rpartition(".")
            module = self.get_submodule(module_name)
            if isinstance(t, GGUFMatrix):
                if name == "embed_tokens.weight":
                    self.embed_tokens = QuantEmbedding(t)
                else:
                    module.weight, module.quant = None, t  # made a QuantLinear below, with its bias
                continue
            setattr(module, attr, nn.Parameter(t.to(dtype).contiguous(), requires_grad=False))
        if any(isinstance(t, GGUFMatrix) for t in state.values()):
            self._quantized_products()
        elif "lm_head.weight" not in weights or self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _quantized_products(self) -> None:
        """Quantised Linears compute on their blocks; in a Llama block q/k/v and gate/up run as
        one product each, with the RMSNorm before them (and SwiGLU after gate/up) folded in, as
        is the final norm into the output projection: fewer dispatches per decode step."""
        for mod in self.modules():
            if isinstance(mod, Linear) and isinstance(mod.quant, GGUFMatrix):
                mod.quant = QuantLinear([mod.quant], None if mod.bias is None else mod.bias.detach())
        for block in self.layers:
            a, m = block.self_attn, block.mlp
            if isinstance(block, Block) and all(p.quant for p in (a.q_proj, a.k_proj, a.v_proj)):
                biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                a.qkv = QuantLinear([*a.q_proj.quant.mats, *a.k_proj.quant.mats, *a.v_proj.quant.mats],
                                    None if biases[0] is None else torch.cat(biases).detach(),
                                    norm=block.input_layernorm)
            if isinstance(block, Block) and m.gate_proj.quant and m.up_proj.quant:
                m.gate_up = QuantLinear([*m.gate_proj.quant.mats, *m.up_proj.quant.mats],
                                        norm=block.post_attention_layernorm, swiglu=True)
        if self.lm_head.quant is not None:
            self.lm_head.quant = QuantLinear(self.lm_head.quant.mats, norm=self.norm)
        if all(isinstance(block, Block) for block in self.layers) and Rope(self.config).plain \
                and self.config.head_dim % 32 == 0 and self.config.head_dim <= 256:  # gguf_decode's heads
            self.decode_step = DecodeStep.build(self)
