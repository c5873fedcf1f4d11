from ..gpu import has_triton
from .naive import naive_gemv, naive_qkv_gemv
from .naive_fp8 import Fp8Weight, naive_fp8_gemv, naive_fp8_matmul

__all__ = ["naive_gemv", "naive_qkv_gemv", "Fp8Weight", "naive_fp8_gemv", "naive_fp8_matmul"]
if has_triton():
    from .triton_fp8 import fp8_gemv, fp8_grouped_matmul, fp8_matmul
    from .triton_gemv import fused_gemv, fused_qkv_gemv

    __all__ += ["fused_gemv", "fused_qkv_gemv", "fp8_gemv", "fp8_matmul", "fp8_grouped_matmul"]
