from .naive import (
    merge_attention,
    naive_append_kv,
    naive_attention,
    naive_block_descriptors,
    naive_block_scores,
    naive_masked_attention,
    naive_rope_append,
    naive_sparse_attention,
    naive_topk_blocks,
)

__all__ = [
    "merge_attention",
    "naive_append_kv",
    "naive_attention",
    "naive_block_descriptors",
    "naive_block_scores",
    "naive_masked_attention",
    "naive_rope_append",
    "naive_sparse_attention",
    "naive_topk_blocks",
]
