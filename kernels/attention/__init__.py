from .naive import (
    merge_attention,
    naive_attention,
    naive_block_descriptors,
    naive_block_scores,
    naive_masked_attention,
    naive_sparse_attention,
    naive_topk_blocks,
)

__all__ = [
    "merge_attention",
    "naive_attention",
    "naive_block_descriptors",
    "naive_block_scores",
    "naive_masked_attention",
    "naive_sparse_attention",
    "naive_topk_blocks",
]
