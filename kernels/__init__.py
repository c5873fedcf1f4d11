"""Compute kernels: per op a PyTorch reference (`naive_*`, runs anywhere) and, where written, a
Triton kernel with the same signature. Knows nothing of models."""
