from ..gpu import has_triton
from .naive import (
    naive_latent_descriptors,
    naive_mla_block_scores,
    naive_mla_routed_attention,
    naive_mla_routed_attention_expanded,
    naive_mla_sparse_attention,
    routed_token_mask,
)

__all__ = ["naive_latent_descriptors", "naive_mla_block_scores", "naive_mla_routed_attention",
           "naive_mla_routed_attention_expanded", "naive_mla_sparse_attention", "routed_token_mask"]
if has_triton():
    from .triton_mla_routed import (
        fused_latent_append,
        fused_mla_block_scores,
        fused_mla_routed_attention,
        fused_mla_routed_attention_expanded,
        store_latent_descriptors,
    )
    from .triton_mla_sparse import fused_mla_sparse_attention

    __all__ += ["fused_latent_append", "fused_mla_block_scores", "fused_mla_routed_attention",
                "fused_mla_routed_attention_expanded", "fused_mla_sparse_attention", "store_latent_descriptors"]
