"""The lesson algorithms re-enacted at tile granularity in NumPy, for small sizes: every tile that moves
between HBM and on-chip memory (SRAM) is a recorded step, and the bytes are counted per tensor.

It never imports the kernels: it re-enacts them, and the tests hold both to the same reference and to
the closed-form traffic counts. ``flashtile viz`` draws its pages from these traces.
"""
from .algorithms import ALGORITHMS, trace
from .core import Step, Trace

__all__ = ["ALGORITHMS", "Step", "Trace", "trace"]
