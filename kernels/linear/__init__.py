import importlib

from ..gpu import has_triton

# Every export loads on first use: the Triton kernels (and the references, which import the rope
# and attention kernel packages) cost about a second to import, which the CPU engine's products
# (gguf_cpu.py, in this package too) should not pay.
_EXPORTS = {"naive_gemv": "naive", "naive_qkv_gemv": "naive", "Fp8Weight": "naive_fp8",
            "naive_fp8_gemv": "naive_fp8", "naive_fp8_matmul": "naive_fp8"}
_TRITON = {"fused_gemv": "triton_gemv", "fused_qkv_gemv": "triton_gemv", "fp8_gemv": "triton_fp8",
           "fp8_matmul": "triton_fp8", "fp8_grouped_matmul": "triton_fp8"}
__all__ = list(_EXPORTS) + (list(_TRITON) if has_triton() else [])


def __getattr__(name):
    module = _EXPORTS.get(name) or (_TRITON.get(name) if has_triton() else None)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
