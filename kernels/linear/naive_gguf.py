"""Reference of gguf_cpu.py: the same products on weights dequantised by the `gguf` package
(numpy, independent of our kernel), in fp32."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def naive_dequantize(blocks: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """uint8 GGUF blocks [rows, bytes per row] -> fp32 [rows, cols]."""
    w = dequantize(blocks.numpy(), GGMLQuantizationType(qtype))
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(blocks.shape[0], cols)


def naive_gguf_mm(x: torch.Tensor, mats) -> torch.Tensor:
    """x [M, K] @ [W_0; W_1; ...]^T in fp32, each W_i a GGUFMatrix."""
    return torch.cat([x.float() @ naive_dequantize(w.blocks, w.qtype, w.cols).t() for w in mats], dim=1)
