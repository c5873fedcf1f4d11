"""The GPU path over the Triton kernels.

- `state.TritonKVState`: a KVState (engine/attention.py) for the engine's model on CUDA,
  same settings and routing as `SparseKVState` (positions='true' only).
- `model`: the Llama-shaped bench model (random bf16 weights, fused ops, fp8 KV option)
  and the CUDA-graph decode step.
- `tiering.SegmentTiers`: KV segments between GPU, pinned CPU memory and disk, LRU, with
  copies on a side stream (its CPU mode is what CI tests).
"""
