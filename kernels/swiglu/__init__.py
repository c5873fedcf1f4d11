from ..gpu import has_triton
from .naive import naive_swiglu

__all__ = ["naive_swiglu"]
if has_triton():
    from .triton_swiglu import fused_swiglu

    __all__ += ["fused_swiglu"]
