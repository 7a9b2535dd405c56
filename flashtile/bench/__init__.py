"""The benchmark harness: peers, the shape grid, tables, JSON and plots. ``python -m flashtile.bench``."""
import sys


def require_gpu(command):
    """Exit with one line (status 1) where ``command`` cannot run: it times kernels on a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"{command} needs a CUDA GPU; `flashtile demo` runs on the CPU under the Triton interpreter")
