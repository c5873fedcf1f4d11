"""A GGUF checkpoint's matrices kept in their quantisation on the CPU.

Q4_0/Q4_1/Q8_0 and Q4_K/Q5_K/Q6_K matrices stay as the file stores them, in memory mapped from
it: a model costs about its file's size in memory and loads in the time it takes to read the
header. Products run on the blocks (kernels/linear/gguf_cpu.py): up to a few activation rows
(decode) as int8 dot products against the blocks, more rows (prefill) by dequantising each matrix
to bf16 a slice at a time for PyTorch's GEMM. q/k/v and gate/up run as one call each. A decode
step of a Llama-family model runs through every block in one kernel call (`DecodeStep`), over an
fp16 KV cache (`Engine.kv_dtype`): on a small model the ten-odd torch ops a layer between the
products cost about as much as the products (bench/results/cpu_engine.md).

Modes (`Engine.load(decode_weights=...)`, a name kept from when only decode used them):
- "auto": the quantised matrices on the CPU where the kernel is available (a C++ compiler and
  an AVX-512 VNNI CPU), everything else dequantised to fp32 — the "fp32" path.
- "fp32": every weight dequantised to fp32 at load (the reference the quantised path is
  tested against, and the only path for Hugging Face checkpoints and other devices).

bench/results/cpu_engine.md has the measurements behind these choices.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from ..kernels.linear.gguf_cpu import GGUFMatrix, GGUFProduct, dequantize, library, unavailable

MODES = ("auto", "fp32")


def resolve_mode(mode: str, device: torch.device | str = "cpu") -> str:
    """Check `mode` for `device`: "auto" stays "auto" on the CPU, where the checkpoint decides."""
    if mode not in MODES:
        raise ValueError(f"decode_weights must be one of {MODES}, not {mode!r}")
    return mode if torch.device(device).type == "cpu" else "fp32"


def keeps_quantized(mode: str, ckpt, dtype: torch.dtype) -> tuple[bool, str]:
    """(whether `ckpt` loads with quantised matrices, why not when it does not)."""
    if mode != "auto":
        return False, f"decode_weights={mode!r}"
    if ckpt.format != "gguf":
        return False, "not a GGUF checkpoint"
    if dtype != torch.float32:
        return False, f"dtype {dtype}"
    if library() is None:
        return False, f"no CPU kernel: {unavailable()}"
    return True, ""


class QuantLinear:
    """y = x @ [W_0; W_1; ...]^T + bias on GGUF matrices with the same columns: x [T, K] fp32,
    y [T, sum of rows] fp32. norm: an RMSNorm module whose weight the product applies to x
    first (the module is then marked `folded`, and passes x through); swiglu: [gate; up] in,
    silu(gate) * up out."""

    def __init__(self, mats: list[GGUFMatrix], bias: torch.Tensor | None = None, *, norm=None,
                 swiglu: bool = False):
        self.mats = tuple(mats)
        self.product = GGUFProduct(mats, bias=bias, swiglu=swiglu, norm=None if norm is None else norm.weight.detach(),
                                   eps=1e-6 if norm is None else norm.eps)
        if norm is not None:
            norm.folded = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.mats)


class QuantEmbedding(nn.Module):
    """Embedding rows dequantised from a GGUF matrix [vocab, hidden] as they are looked up."""

    def __init__(self, weight: GGUFMatrix):
        super().__init__()
        self.quant = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.quant.blocks.index_select(0, ids.reshape(-1))
        return dequantize(GGUFMatrix(rows, self.quant.qtype, self.quant.cols)).view(*ids.shape, -1)


class _Layer(ctypes.Structure):
    """gguf_cpu.cpp's DecodeLayer: one block's matrices (q/k/v, o, gate/up, down), norms, bias."""
    _fields_ = [("w", ctypes.c_void_p * 7), ("rows", ctypes.c_int64 * 7), ("row_bytes", ctypes.c_int64 * 7),
                ("qtypes", ctypes.c_int * 7), ("nmat", ctypes.c_int * 4), ("norm_in", ctypes.c_void_p),
                ("norm_post", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p), ("eps", ctypes.c_float)]


class DecodeStep:
    """A decode step (one token) through every block of a Llama-family model in one call of the
    compiled kernel (gguf_decode): the products on the GGUF blocks, RoPE and attention over the
    fp16 cache (engine/dense.py), norms, SwiGLU and residual adds, with no Python between
    them. `build` returns None for a model it does not fit (a block without its fused products,
    q/k norms), which then decodes through its modules."""

    def __init__(self, model, layers: list[_Layer], keep: list):
        c = model.config
        self.layers, self._keep = (_Layer * len(layers))(*layers), keep
        self.sizes = (c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate)

    @classmethod
    def build(cls, model) -> DecodeStep | None:
        layers, keep = [], []
        for block in model.layers:
            a, m = getattr(block, "self_attn", None), getattr(block, "mlp", None)
            if getattr(a, "qkv", None) is None or getattr(m, "gate_up", None) is None \
                    or getattr(a, "q_norm", None) is not None or a.o_proj.quant is None or m.down_proj.quant is None:
                return None
            products = (a.qkv, a.o_proj.quant, m.gate_up, m.down_proj.quant)
            mats = [w for p in products for w in p.mats]
            if len(mats) > 7:
                return None
            qkv, gate_up = a.qkv.product, m.gate_up.product
            layer = _Layer(eps=qkv.eps)
            for i, w in enumerate(mats):
                layer.w[i], layer.rows[i], layer.row_bytes[i] = w.blocks.data_ptr(), w.rows, w.blocks.shape[1]
                layer.qtypes[i] = w.qtype
            for i, p in enumerate(products):
                layer.nmat[i] = len(p.mats)
            layer.norm_in, layer.norm_post = qkv.norm.data_ptr(), gate_up.norm.data_ptr()
            layer.qkv_bias = None if qkv.bias is None else qkv.bias.data_ptr()
            layers.append(layer)
            keep += [p.mats for p in products] + [qkv.norm, gate_up.norm, qkv.bias]
        return cls(model, layers, keep) if layers else None

    def __call__(self, x: torch.Tensor, state, positions: torch.Tensor) -> torch.Tensor:
        """x [1, hidden] (fp32, the token's embedding) through every block, in place; the new keys
        and values go to `state` (a DenseKVState whose `compiled` is true) at its next row."""
        pos = state.num_tokens
        state.reserve(pos + 1)
        cos, sin = state.rope.cos_sin(positions)
        rc = library().gguf_decode(self.layers, len(self.layers), x.data_ptr(), *self.sizes, state.k.data_ptr(),
                                   state.v.data_ptr(), state.capacity, pos, cos.data_ptr(), sin.data_ptr(),
                                   torch.get_num_threads())
        if rc != 0:
            raise ValueError(f"gguf_decode failed ({rc})")
        return x


def summary(model, reason: str) -> dict:
    """What the model's matrices are: {"mode": "gguf" | "fp32", "bytes": quantised bytes held
    (the mapped file's pages), "reason": why fp32 where it is}."""
    seen, total = set(), 0
    for mod in model.modules():
        for q in (getattr(mod, "quant", None), getattr(mod, "qkv", None), getattr(mod, "gate_up", None)):
            mats = q.mats if isinstance(q, QuantLinear) else (q,) if isinstance(q, GGUFMatrix) else ()
            for m in mats:
                if m.blocks.data_ptr() not in seen:
                    seen.add(m.blocks.data_ptr())
                    total += m.nbytes
    if total == 0:
        return {"mode": "fp32", "bytes": 0, "reason": reason or "no matrix in a block type the kernel reads"}
    return {"mode": "gguf", "bytes": total, "reason": ""}
