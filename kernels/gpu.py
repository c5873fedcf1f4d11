"""Where Triton kernels can run: on a CUDA device, or anywhere under TRITON_INTERPRET=1.

Nothing here imports triton at module import time, so CPU-only installs import cleanly.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def has_cuda() -> bool:
    return torch.cuda.is_available()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(t: torch.Tensor) -> bool:
    """True when a Triton kernel can take `t`: a CUDA tensor, or any tensor under the interpreter."""
    return has_triton() and (t.is_cuda or interpreting())


def device_summary() -> str:
    if not has_cuda():
        return "cpu"
    p = torch.cuda.get_device_properties(0)
    return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, cc {p.major}.{p.minor}"
