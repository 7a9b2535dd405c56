"""Triton kernels. Each algorithm lives in its own file; they share the online-softmax step."""
