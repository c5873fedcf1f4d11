"""Decode-only weight copies for CPU.

A decode step multiplies one row by every weight, so it is bound by how many bytes of weights it
reads; prefill multiplies hundreds of rows and is bound by arithmetic. On an AVX2 CPU the fp32
weights are right for prefill (bf16 GEMMs were 6.6x slower there) and wrong for decode (540 MB
read per token for the default model). So decode gets its own copies, used for inputs of at most
DECODE_MAX_ROWS rows, while prefill keeps the fp32 parameters:

- "q4": GGUF Q4_0/Q4_1 tensors stay 4-bit, in PyTorch's CPU int4 weight-only layout (group 32,
  as GGUF's blocks); q/k/v and gate/up are fused into one matrix each (fewer calls per token).
  Other tensors get bf16 copies. Activations go through the kernel as bf16 (its only vectorised
  dtype on AVX2) and come out as bf16: that rounding, not the weights, is the main difference
  from the fp32 path. The copies return bf16 (fp32 with a bias) and the model converts only where
  fp32 matters (q/k before RoPE; the residual adds promote), which saves a conversion per call.
- "bf16": bf16 copies of every projection.
- "auto": "q4" on CPU for a checkpoint with Q4_0/Q4_1 matrices (the default model), else fp32.
- the output projection is an fp16 copy in both modes; its top candidates are re-scored with the
  fp32 weights, so the greedy token is the one the fp32 weights give for the same hidden state.
  In "q4" mode plain greedy decoding screens with a 4-bit copy instead (`OutputHead.screen`).

bench/results/cpu_engine.md has the per-shape timings behind these choices.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

# The int4 kernel dequantises once per block of up to 4 rows; beyond 4 rows the fp32 GEMM wins.
DECODE_MAX_ROWS = 4
MODES = ("auto", "fp32", "bf16", "q4")
_GROUP = 32
_REFINE = 16  # output candidates re-scored in fp32; far more than fp16 rounding can reorder
_SCREEN = 64  # ... after 4-bit screening (OutputHead.screen): 16x the worst rank seen

_PACK = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
_MM = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
Q4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)


def resolve_mode(mode: str, device: torch.device | str = "cpu") -> str:
    """Check `mode` for `device`; "auto" stays "auto" on CPU, where the checkpoint decides."""
    if mode not in MODES:
        raise ValueError(f"decode_weights must be one of {MODES}, not {mode!r}")
    on_cpu = torch.device(device).type == "cpu"
    if mode == "auto":
        return "auto" if on_cpu and _MM is not None else "fp32"
    if mode != "fp32" and not on_cpu:
        raise ValueError(f"decode_weights={mode!r} is for CPU inference only")
    if mode == "q4" and _MM is None:
        raise RuntimeError("this PyTorch build has no CPU int4 weight-only matmul")
    return mode


class Q4Weight:
    """4-bit codes q [N, K] (0..15) with per-32-column scale/zero so that w = scale*(q-8) + zero,
    the convention of PyTorch's int4 kernel."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
        self.q, self.scale, self.zero = q, scale, zero

    @classmethod
    def from_gguf_rows(cls, rows: np.ndarray, qtype: GGMLQuantizationType) -> Q4Weight:
        """rows: raw GGUF blocks [N, K/32 * block bytes] (uint8)."""
        n = rows.shape[0]
        nbytes = 20 if qtype == GGMLQuantizationType.Q4_1 else 18
        b = torch.from_numpy(np.ascontiguousarray(rows)).view(n, -1, nbytes)
        d = b[..., 0:2].contiguous().view(torch.float16).float()[..., 0]
        qs = b[..., nbytes - 16:]
        # ggml: element j of a block is byte j's low nibble, element j+16 its high nibble.
        q = torch.cat((qs & 0x0F, qs >> 4), dim=-1).reshape(n, -1)
        if qtype == GGMLQuantizationType.Q4_1:  # w = d*q + m = d*(q-8) + (m + 8d)
            m = b[..., 2:4].contiguous().view(torch.float16).float()[..., 0]
            return cls(q, d, m + 8 * d)
        return cls(q, d, torch.zeros_like(d))  # Q4_0: w = d*(q-8)

    @staticmethod
    def cat(parts: list[Q4Weight]) -> Q4Weight:
        return Q4Weight(*(torch.cat([getattr(p, a) for p in parts]) for a in ("q", "scale", "zero")))

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Q4Weight:
        """Our own 4-bit codes for a float matrix [N, K]: per 32 columns, 16 levels spanning
        min..max (GGUF Q4_1's scheme)."""
        g = w.float().unflatten(1, (-1, _GROUP))
        lo, hi = g.amin(-1), g.amax(-1)
        scale = ((hi - lo) / 15).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
        return cls(q.flatten(1), scale, lo + 8 * scale)

    def dequantize(self, as_kernel: bool = True) -> torch.Tensor:
        """fp32 [N, K]: the weights the kernel sees (its scale/zero are bf16), or with
        as_kernel=False those of the fp32 scale/zero (the GGUF's values)."""
        s, z = self.scale, self.zero
        if as_kernel:
            s, z = s.bfloat16().float(), z.bfloat16().float()
        w = (self.q.float() - 8).unflatten(1, (-1, _GROUP)) * s[..., None] + z[..., None]
        return w.flatten(1)


class Q4Linear:
    def __init__(self, w: Q4Weight, bias: torch.Tensor | None = None):
        self.packed = _PACK(w.q.to(torch.int32), 1)
        self.scales_zeros = torch.stack((w.scale, w.zero), dim=-1).transpose(0, 1).contiguous().bfloat16()
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = _MM(x.to(torch.bfloat16), self.packed, _GROUP, self.scales_zeros)
        return y if self.bias is None else y + self.bias


class HalfLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16):
        self.weight, self.bias = weight.to(dtype), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(self.weight.dtype), self.weight)
        return y if self.bias is None else y + self.bias


class OutputHead:
    """fp16 logits (the input is a normed hidden state, well inside fp16's range), with the top
    candidates recomputed from the fp32 weights.

    `screen(x)` is for callers that only take the argmax (plain greedy decoding): 4-bit weights
    of our own (group 32, min/max per group; the GGUF's output matrix is 8-bit) pick _SCREEN
    candidates, which are recomputed in fp32. The 4-bit logits are off by 0.36 on average (4.3 at
    most) on the default model; the fp32 argmax was within their top 4 on every one of 400 text
    positions, so the argmax is the fp32 one; the other logits are only approximate, which is
    why sampling and constrained decoding use the fp16 path.
    """

    def __init__(self, weight: torch.Tensor, screen: bool = False):
        self.exact = weight
        self.half = weight.half()
        self.screens = screen and _MM is not None
        self._q4: Q4Linear | None = None  # built on first use (0.4 s): the ask path never screens

    @property
    def q4(self) -> Q4Linear | None:
        if self.screens and self._q4 is None:
            self._q4 = Q4Linear(Q4Weight.quantize(self.exact))
        return self._q4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._refine(x, F.linear(x.half(), self.half).float(), _REFINE)

    def screen(self, x: torch.Tensor) -> torch.Tensor:
        q4 = self.q4
        if q4 is None:
            return self(x)
        return self._refine(x, q4(x).float(), _SCREEN)

    def _refine(self, x: torch.Tensor, logits: torch.Tensor, k: int) -> torch.Tensor:
        top = logits.topk(k, dim=-1).indices
        exact = torch.einsum("th,tkh->tk", x, self.exact[top])
        return logits.scatter_(-1, top, exact)


def attach(model, ckpt, mode: str) -> dict:
    """Build the decode copies of `model` (fp32 parameters already loaded from `ckpt`) and hang
    them on its modules. Returns a summary: mode and bytes of the copies."""
    mode = resolve_mode(mode)
    q4 = ckpt.q4_blocks() if mode in ("q4", "auto") else {}
    if mode == "auto":
        # Only 4-bit checkpoints: for float ones, bf16 copies would trade exactness for speed,
        # which the caller should ask for.
        mode = "q4" if q4 else "fp32"
    if mode == "fp32":
        return {"mode": mode, "bytes": 0}

    def q4_of(name: str) -> Q4Weight | None:
        # Decoded one fused matrix at a time: the codes of the whole model at once would be
        # a transient copy as large as the fp32 weights.
        return Q4Weight.from_gguf_rows(*q4[name]) if name in q4 else None

    def bias_of(lin):
        return None if lin.bias is None else lin.bias.detach()

    def build(linears, names):
        ws = [q4_of(n) for n in names]
        bias = [bias_of(lin) for lin in linears]
        b = None if bias[0] is None else torch.cat(bias)
        if all(w is not None for w in ws):
            return Q4Linear(Q4Weight.cat(ws), b)
        return HalfLinear(torch.cat([lin.weight for lin in linears]), b)

    for i, block in enumerate(model.layers):
        pre = f"model.layers.{i}."
        a, m = block.self_attn, block.mlp
        a.decode_qkv = build([a.q_proj, a.k_proj, a.v_proj],
                             [pre + f"self_attn.{p}_proj.weight" for p in "qkv"])
        a.o_proj.decode = build([a.o_proj], [pre + "self_attn.o_proj.weight"])
        m.decode_gate_up = build([m.gate_proj, m.up_proj],
                                 [pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"])
        m.down_proj.decode = build([m.down_proj], [pre + "mlp.down_proj.weight"])
    model.lm_head.decode = OutputHead(model.lm_head.weight, screen=mode == "q4")
    return {"mode": mode, "bytes": decode_bytes(model)}


def decode_bytes(model) -> int:
    seen, total = set(), 0
    for mod in model.modules():
        for attr in ("decode", "decode_qkv", "decode_gate_up"):
            d = getattr(mod, attr, None)
            if d is None:
                continue
            for t in (getattr(d, k, None) for k in ("packed", "scales_zeros", "weight", "half")):
                if t is not None and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total
