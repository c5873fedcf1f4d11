"""MoE prefill without host synchronisation: a chunk's (token, expert) pairs sorted by expert and
every expert run by one grouped GEMM per projection.

The group sizes stay on the device (cumulative ends from `searchsorted` on the sorted expert
ids), so nothing waits for the GPU between layers: `torch._grouped_mm` (CUTLASS on CUDA, bf16;
torch >= 2.9 also has a CPU kernel) takes them as they are. fp32 on CUDA (the tests' reference
dtype) has no grouped kernel: there one GEMM per expert runs after one read of the sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _grouped_kernel(a: torch.Tensor) -> bool:
    return hasattr(torch, "_grouped_mm") and (a.device.type == "cpu" or a.dtype == torch.bfloat16)


def grouped_mm(a: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """a [N, K] (rows grouped by expert), w [E, M, K] (nn.Linear layout per expert), ends [E]
    int32 (cumulative end row of each expert's group) -> [N, M]: a[rows of e] @ w[e].T."""
    if _grouped_kernel(a):
        return torch._grouped_mm(a, w.transpose(1, 2), offs=ends)
    out = a.new_empty(a.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):  # one host read of the sizes (fp32 on CUDA only)
        if end > start:
            torch.mm(a[start:end], w[e].t(), out=out[start:end])
        start = end
    return out


def moe_prefill(h: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                weights: torch.Tensor, residual: torch.Tensor, mm=grouped_mm) -> torch.Tensor:
    """residual [T, H] += sum_k weights[t, k] * expert_{ids[t, k]}(h[t]) for a chunk of T tokens,
    in place (returned). h [T, H], w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I],
    ids / weights [T, K] (a shared expert stacked into w13/w2 is one more column with weight 1).
    mm: the grouped product (kernels/linear/triton_fp8.py `fp8_grouped_matmul` for FP8 experts)."""
    t, k = ids.shape
    flat = ids.reshape(-1)
    sorted_ids, order = flat.sort(stable=True)
    ends = torch.searchsorted(sorted_ids, torch.arange(w13.shape[0], device=h.device), right=True,
                              out_int32=True)
    gu = mm(h[order // k], w13, ends)
    i = w13.shape[1] // 2
    if gu.is_cuda:  # one pass over the [T K, 2I] activations instead of three
        from ..swiglu.triton_swiglu import fused_swiglu

        act = fused_swiglu(gu[:, :i], gu[:, i:])
    else:
        act = F.silu(gu[:, :i]) * gu[:, i:]
    ys = mm(act, w2, ends)
    del act
    del gu
    # where each token's j-th choice landed in ys (the inverse of the sort's permutation)
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return moe_combine(ys, inv, weights, residual)


def moe_combine(ys: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual [T, H] += sum_j weights[t, j] * ys[inv[t K + j]] in place (returned): each token's
    K expert outputs (ys [T K, H] in expert order) weighted and summed. One Triton pass on CUDA
    (kernels/moe/triton_combine.py); here a gather into token order and one batched product."""
    if ys.is_cuda:
        from .triton_combine import fused_moe_combine

        return fused_moe_combine(ys, inv, weights, residual)
    t, k = weights.shape
    back = ys.index_select(0, inv)
    residual.view(t, 1, -1).baddbmm_(weights.to(ys.dtype).view(t, 1, k), back.view(t, k, -1))
    return residual
