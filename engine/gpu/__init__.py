"""The GPU path over the Triton kernels.

- `state.TritonKVState`: a KVState (engine/attention.py) for the engine's model on CUDA,
  same settings and routing as `SparseKVState` (positions='true' only).
- `model`: the Llama-shaped bench model (random bf16 weights, fused ops, fp8 KV option)
  and the CUDA-graph decode step.
- `tiering.SegmentTiers`: KV segments between GPU, pinned CPU memory and disk, LRU, with
  copies on a side stream (its CPU mode is what CI tests).
- `tiering.TieredKVCache`: the bench model's KV cache for contexts whose bf16 KV does not fit
  beside the weights (1M tokens on one H200): a GPU ring plus pinned CPU memory, segments moved
  oldest-written first on a side stream, a block table the attention kernel reads through
  (CPU-resident blocks read in place over PCIe in decode, staged to the GPU in prefill).
  Optional: GPU "hot" slots that the most-picked CPU segments are promoted to (decode counts
  its picks on the device; `rebalance()` between graph replays moves them), and a capped CPU
  pool with disk as the cold tier (LRU segment files; while any segment is on disk the model
  checks each attention launch's picks on the host and faults them back first: eager only).
"""
