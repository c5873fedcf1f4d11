from ..gpu import has_triton
from .naive import naive_mla_sparse_attention

__all__ = ["naive_mla_sparse_attention"]
if has_triton():
    from .triton_mla_sparse import fused_mla_sparse_attention

    __all__ += ["fused_mla_sparse_attention"]
