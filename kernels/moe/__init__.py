from ..gpu import has_triton
from .naive import naive_moe_down, naive_moe_gate_up

__all__ = ["naive_moe_down", "naive_moe_gate_up"]
if has_triton():
    from .triton_moe import fused_moe_down, fused_moe_gate_up

    __all__ += ["fused_moe_down", "fused_moe_gate_up"]
