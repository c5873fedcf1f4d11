"""The engine on CUDA, over the Triton kernels of kernels/.

- `model.CudaDecoder`: the decoder `Engine.load(..., device="cuda")` builds from any checkpoint
  the engine loads but GLM's MLA models (`glm.GlmCudaDecoder`; their MoE layer, `moe.MoeLayer`,
  is GLM-4.5's too) (fused q/k/v and gate/up weights, decode GEMVs with norm/SwiGLU/residual
  fused, RoPE + KV append in the qkv GEMV), and `GraphedDecode`, its CUDA-graphed decode step.
- `state.CudaKVState` and `state.new_cuda_state`: the KV state (every position on the GPU)
  and the one factory `Engine.new_state` uses on CUDA.
- `tiering.TieredKVCache`: the same state for contexts whose KV does not fit beside the
  weights: a GPU ring, pinned CPU memory read in place (decode) or staged (prefill), optional
  GPU hot slots for often-routed segments and a disk tier.
"""
