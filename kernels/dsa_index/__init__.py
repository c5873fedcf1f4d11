from ..gpu import has_triton
from .naive import naive_index_scores, naive_index_topk

__all__ = ["naive_index_scores", "naive_index_topk"]
if has_triton():
    from .triton_index import fused_index_scores, fused_index_topk

    __all__ += ["fused_index_scores", "fused_index_topk"]
