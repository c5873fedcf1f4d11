from ..gpu import has_triton
from .naive import naive_gemv, naive_qkv_gemv

__all__ = ["naive_gemv", "naive_qkv_gemv"]
if has_triton():
    from .triton_gemv import fused_gemv, fused_qkv_gemv

    __all__ += ["fused_gemv", "fused_qkv_gemv"]
