from ..gpu import has_triton
from .naive import naive_mla_decode

__all__ = ["naive_mla_decode"]
if has_triton():
    from .triton_mla_decode import fused_mla_decode

    __all__ += ["fused_mla_decode"]
