from .naive import naive_rms_norm
from ..gpu import has_triton

__all__ = ["naive_rms_norm"]
if has_triton():
    from .triton_rms_norm import fused_rms_norm

    __all__ += ["fused_rms_norm"]
