from ..gpu import has_triton
from .naive import naive_argmax

__all__ = ["naive_argmax"]
if has_triton():
    from .triton_argmax import fused_argmax

    __all__ += ["fused_argmax"]
