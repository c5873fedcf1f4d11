from ..gpu import has_triton
from .naive import naive_rope, rope_cos_sin

__all__ = ["naive_rope", "rope_cos_sin"]
if has_triton():
    from .triton_rope import fused_rope

    __all__ += ["fused_rope"]
