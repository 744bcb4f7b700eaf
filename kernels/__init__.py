"""Flint's kernels: each fast (Triton) kernel beside the PyTorch reference it must match."""
