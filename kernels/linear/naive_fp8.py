"""Block-scaled FP8 (e4m3) weights as the FP8 kernels read them, and the kernels' references.

The official DeepSeek-V3 / GLM-5 FP8 checkpoints store a matrix W [N, K] as float8_e4m3fn W8
plus one fp32 scale per bo x bi block (`weight_scale_inv` [ceil(N/bo), ceil(K/bi)]), W = W8 *
scale. `Fp8Weight` keeps W8 as stored and the scales expanded along the rows only ([N,
ceil(K/bi)], 4 bytes per bi weights: 3 % for bi = 128): then matrices whose row counts are not
multiples of bo (GLM-5's kv_a_proj has 576 rows) still concatenate into one fused projection,
and a kernel reads one scale per (row, column block) with no row-block arithmetic.

Building a model's weights from them (engine/gpu/glm.py, engine/gpu/moe.py, engine/gpu/model.py):
`pair_scales` (a checkpoint's `X` + `X_scale_inv` as one Fp8Weight), `take_rows` (rows in
another order: GLM's q/k dims on CudaDecoder), `fuse_rows` (a fused projection; parts that mix
FP8 and plain matrices stay runs), `stack_experts`, `append_expert` (the shared expert as one
more), `plain` (dequantise where a kernel needs it).

References (fp32 PyTorch): `naive_fp8_gemv` (the decode GEMV, with `naive_gemv`'s fused
RMSNorm / SwiGLU / residual), `naive_fp8_matmul` (prefill: either the dequantised weight, or
DeepSeek-V3's scheme with the activations also quantised to e4m3 per row and bi columns).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .naive import naive_gemv

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


class Fp8Weight(NamedTuple):
    """w [..., N, K] float8_e4m3fn, scale [..., N, ceil(K / bk)] fp32: W[n, k] = w[n, k] * scale[n, k // bk]."""

    w: torch.Tensor
    scale: torch.Tensor
    bk: int

    @classmethod
    def from_blocks(cls, w8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> Fp8Weight:
        """From a checkpoint's W8 [..., N, K] and block scales [..., ceil(N/bo), ceil(K/bi)]."""
        bo, bi = block
        n, k = w8.shape[-2:]
        if tuple(scale_inv.shape[-2:]) != (-(-n // bo), -(-k // bi)) or w8.dtype != FP8:
            raise ValueError(f"FP8 weight {tuple(w8.shape)} {w8.dtype} and scales {tuple(scale_inv.shape)} do not "
                             f"fit {bo}x{bi} blocks")
        rows = scale_inv.float().repeat_interleave(bo, dim=-2)[..., :n, :]
        return cls(w8.contiguous(), rows.contiguous(), bi)

    @property
    def shape(self) -> torch.Size:
        return self.w.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        s = self.scale.repeat_interleave(self.bk, dim=-1)[..., : self.w.shape[-1]]
        return (self.w.float() * s).to(dtype)

    def nbytes(self) -> int:
        return self.w.numel() + self.scale.numel() * self.scale.element_size()


def cat_rows(parts: list[Fp8Weight]) -> Fp8Weight:
    """One fused matrix from row blocks (same K and column blocks)."""
    if len({p.bk for p in parts}) != 1:
        raise ValueError("FP8 parts with different column blocks do not concatenate")
    return Fp8Weight(torch.cat([p.w for p in parts], dim=-2), torch.cat([p.scale for p in parts], dim=-2),
                     parts[0].bk)


def pair_scales(tensors: dict, block: tuple[int, int]) -> None:
    """In place: each checkpoint tensor `X` with an `X_scale_inv` beside it (`X.weight`, or
    stacked experts' `experts.gate_up_proj`) becomes one `Fp8Weight`; other tensors stay."""
    for name in [n for n in tensors if n.endswith("_scale_inv")]:
        w = name.removesuffix("_scale_inv")
        tensors[w] = Fp8Weight.from_blocks(tensors.pop(w), tensors.pop(name), block)


def take_rows(w, index):
    """Rows `index` of a plain matrix (or vector) or of an `Fp8Weight`. Exact for any row order:
    an Fp8Weight's scales are per row (a permutation inside a checkpoint block keeps each row's
    scale, which the per-block form could not express once rows of two blocks mix)."""
    if is_fp8(w):  # the e4m3 bytes moved as uint8: indexing kernels cover it on every build
        return Fp8Weight(w.w.view(torch.uint8)[index].view(w.w.dtype), w.scale[index], w.bk)
    return w[index]


def held_bytes(x) -> int:
    """Bytes of the distinct tensors in x: a tensor, or tuples / lists holding them (Fp8Weight's
    e4m3 weights and fp32 scales, fused runs, norm pairs), each storage counted once."""
    seen, total = set(), 0
    stack = [x]
    while stack:
        y = stack.pop()
        if isinstance(y, (tuple, list)):
            stack.extend(y)
        elif isinstance(y, torch.Tensor) and y.data_ptr() not in seen:
            seen.add(y.data_ptr())
            total += y.numel() * y.element_size()
    return total


def is_fp8(w) -> bool:
    return isinstance(w, Fp8Weight)


def plain(w, dtype: torch.dtype) -> torch.Tensor:
    """W as a plain matrix: an `Fp8Weight` dequantised to dtype, anything else as it is."""
    return w.dequantize(dtype) if is_fp8(w) else w


def fuse_rows(parts: list, dtype: torch.dtype, *, runs: bool = True):
    """Row-concatenation of a fused projection's matrices. All FP8 or all plain: one matrix.
    Mixed: with `runs`, a list of matrices (consecutive FP8 parts fused, plain ones fused), whose
    outputs triton_fp8.py `linear_gemv` / `linear_mm` concatenate; without, one plain matrix (FP8
    parts dequantised: the SwiGLU and expert kernels read gate and up rows from one matrix)."""
    groups: list[list] = []
    for p in parts:
        if groups and is_fp8(p) == is_fp8(groups[-1][-1]):
            groups[-1].append(p)
        else:
            groups.append([p])
    if len(groups) > 1 and not runs:
        return torch.cat([plain(p, dtype) for p in parts])
    fused = [cat_rows(g) if is_fp8(g[0]) else torch.cat(g) for g in groups]
    return fused[0] if len(fused) == 1 else fused


def stack_experts(mats: list, dtype: torch.dtype):
    """Experts' matrices stacked [E, rows, cols]: all FP8, weights and scales alike; else plain."""
    if all(is_fp8(m) for m in mats):
        return Fp8Weight(torch.stack([m.w for m in mats]), torch.stack([m.scale for m in mats]), mats[0].bk)
    return torch.stack([plain(m, dtype) for m in mats])


def append_expert(stacked, one):
    """[E, rows, cols] experts and one more [rows, cols] (both FP8 or both plain) -> [E + 1, rows, cols]."""
    if is_fp8(stacked):
        return Fp8Weight(torch.cat([stacked.w, one.w[None]]), torch.cat([stacked.scale, one.scale[None]]), stacked.bk)
    return torch.cat([stacked, one[None]])


def quantize_rows(x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K / bk)]): per row and bk
    columns, scale = amax / 448 (DeepSeek-V3's per-token-group quantisation)."""
    m, k = x.shape
    nb = -(-k // bk)
    padded = x.float().new_zeros(m, nb * bk)
    padded[:, :k] = x.float()
    groups = padded.view(m, nb, bk)
    scale = groups.abs().amax(-1).clamp_min(1e-12) / E4M3_MAX
    q = (groups / scale[..., None]).to(FP8).view(m, nb * bk)[:, :k]
    return q, scale


def naive_fp8_gemv(x: torch.Tensor, w: Fp8Weight, **kw) -> torch.Tensor:
    """`naive_gemv` (same keywords) with W dequantised."""
    return naive_gemv(x, w.dequantize(), **kw)


def naive_fp8_matmul(x: torch.Tensor, w: Fp8Weight, *, act_fp8: bool = False) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype, fp32 arithmetic. act_fp8: x quantised first by
    `quantize_rows` with W's column blocks, so each block's product is e4m3 x e4m3."""
    xf = x.float()
    if act_fp8:
        q, s = quantize_rows(x, w.bk)
        xf = q.float() * s.repeat_interleave(w.bk, dim=-1)[:, : x.shape[1]]
    return (xf @ w.dequantize().t()).to(x.dtype)
