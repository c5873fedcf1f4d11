from ..gpu import has_triton
from .naive import naive_moe_down, naive_moe_gate_up

__all__ = ["naive_moe_down", "naive_moe_gate_up"]
if has_triton():
    from .triton_moe import fused_moe_down, fused_moe_gate_up
    from .triton_moe_fp8 import fp8_moe_down, fp8_moe_gate_up

    __all__ += ["fused_moe_down", "fused_moe_gate_up", "fp8_moe_down", "fp8_moe_gate_up"]
