"""Portable Triton kernels: any CUDA GPU, and the CPU through the Triton interpreter."""
