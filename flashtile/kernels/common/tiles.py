"""Tile plumbing shared by the forward and backward kernels: loading and storing one head's rows through
tensor descriptors, and which tiles of a row band a mask leaves whole, cut or empty.

The band: query i may see key j when i + diag - left <= j <= i + diag + right (each side only when its
MASK_* flag is set) and j < seqlen. A kernel that owns keys and iterates queries uses the same helpers
with diag -> -diag and the sides swapped.
"""
import functools

import torch
import triton
import triton.language as tl


@triton.jit
def load_tile(desc, b, row, h, BLOCK: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IS_VARLEN: tl.constexpr):
    """[BLOCK, HEAD_DIM_PAD] rows of one head: a 2-D per-sequence descriptor (varlen) or 4-D (b, n, h, d)."""
    if IS_VARLEN:
        tile = desc.load([row, 0])
    else:
        tile = desc.load([b, row, h, 0]).reshape(BLOCK, HEAD_DIM_PAD)
    return tile


@triton.jit
def store_tile(desc, b, row, h, tile, IS_VARLEN: tl.constexpr):
    if IS_VARLEN:
        desc.store([row, 0], tile)
    else:
        desc.store([b, row, h, 0], tile.reshape(1, tile.shape[0], 1, tile.shape[1]))


@triton.jit
def reduce_tile(desc, b, row, h, tile, IS_VARLEN: tl.constexpr):
    """Adds ``tile`` into memory as one bulk reduce by the copy engine; rows and columns out of bounds drop."""
    if IS_VARLEN:
        desc.atomic_add([row, 0], tile)
    else:
        desc.atomic_add([b, row, h, 0], tile.reshape(1, tile.shape[0], 1, tile.shape[1]))


@triton.jit
def sequence_desc(ptr, start, stride_n, head_offset, seqlen, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                  HEAD_DIM_PAD: tl.constexpr):
    """A 2-D descriptor over one head of one packed sequence; its bounds mask the ragged tail."""
    return tl.make_tensor_descriptor(ptr + start * stride_n + head_offset, shape=[tl.maximum(seqlen, 1), HEAD_DIM],
                                     strides=[stride_n, 1], block_shape=[BLOCK, HEAD_DIM_PAD])


@triton.jit
def sequence_bounds(cu_seqlens, b, seqlen, IS_VARLEN: tl.constexpr):
    """(first row, length) of sequence b: from cu_seqlens when packed, else (0, seqlen)."""
    start = tl.zeros([], tl.int64)
    if IS_VARLEN:
        start = tl.load(cu_seqlens + b).to(tl.int64)
        seqlen = (tl.load(cu_seqlens + b + 1) - start).to(tl.int32)
    return start, seqlen


@triton.jit
def q_tile_program(cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, group, BLOCK_M: tl.constexpr,
                   IS_VARLEN: tl.constexpr):
    """The Q tile a program of a (Q tiles, batch·heads) grid owns: Q tiles with the most keys (the last
    ones, under a causal mask) come first. Returns start_m, b, h, h_k and both sequences' (start, length)."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1) // nheads
    h = tl.program_id(1) % nheads
    q_start, seqlen_q = sequence_bounds(cu_seqlens_q, b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(cu_seqlens_k, b, seqlen_k, IS_VARLEN)
    return pid_m * BLOCK_M, b, h, h // group, q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def band_mask(own, other, seqlen_other, diag, left, right, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    """[len(own), len(other)]: True where row ``own`` may see column ``other``."""
    ok = other[None, :] < seqlen_other
    if MASK_RIGHT:
        ok &= other[None, :] <= (own + diag + right)[:, None]
    if MASK_LEFT:
        ok &= other[None, :] >= (own + diag - left)[:, None]
    return ok


@triton.jit
def band_tiles(start, seqlen_other, diag, left, right, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr,
               MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    """For rows [start, start + BLOCK_OWN): lo <= full_lo <= full_hi <= hi such that tiles in
    [lo, full_lo) and [full_hi, hi) need the mask, [full_lo, full_hi) are whole, the rest are empty."""
    lo = 0
    hi = seqlen_other
    full_lo = 0
    full_hi = seqlen_other // BLOCK_OTHER * BLOCK_OTHER
    if MASK_LEFT:
        lo = tl.maximum(start + diag - left, 0) // BLOCK_OTHER * BLOCK_OTHER
        full_lo = tl.cdiv(tl.maximum(start + BLOCK_OWN - 1 + diag - left, 0), BLOCK_OTHER) * BLOCK_OTHER
    if MASK_RIGHT:
        hi = tl.minimum(hi, start + BLOCK_OWN + diag + right)
        full_hi = tl.minimum(seqlen_other, tl.maximum(start + diag + right + 1, 0)) // BLOCK_OTHER * BLOCK_OTHER
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


def tma_addressable(t):
    """Can a TMA descriptor address ``t``: 16-byte aligned base and strides, unit last stride, and no
    zero stride on a dim longer than 1 (expanded tensors)."""
    return t.data_ptr() % 16 == 0 and _tma_strides(t.shape, t.stride(), t.element_size())


@functools.lru_cache(maxsize=1024)
def _tma_strides(shape, stride, size):
    """tma_addressable's test of the strides, once per (shape, strides, element size): it runs on every eager call."""
    return stride[-1] == 1 and all(s * size % 16 == 0 and (s > 0 or n == 1) for s, n in zip(stride[:-1], shape[:-1]))


def host_descriptors(tensors_and_blocks, head_dim_pad, heads=1):
    """4-D (batch, seqlen, nheads, headdim) TMA descriptors, one tile of ``block`` rows of one head each, or with
    ``heads`` > 1 over the (batch, nheads, seqlen, headdim) view, a tile of ``block`` rows of each of ``heads`` heads.
    The tensors come through ops._tma_ready, so the constructor's validation (a third of the host time
    of a launch) is skipped."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    descs = []
    for t, block in tensors_and_blocks:
        desc = object.__new__(TensorDescriptor)
        t = t.transpose(1, 2) if heads > 1 else t
        desc.base, desc.shape, desc.strides = t, list(t.shape), list(t.stride())
        desc.block_shape = [1, heads, block, head_dim_pad] if heads > 1 else [1, block, 1, head_dim_pad]
        desc.padding = "zero"
        descs.append(desc)
    return tuple(descs)


@functools.lru_cache(maxsize=None)
def num_sms(device):
    """The device's SM count; 4 for the CPU (the interpreter), so that grids sized by it stay small there."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def cdiv(a, b):
    """Host-side ceil division (triton.cdiv is a jit function: microseconds per host call)."""
    return -(-a // b)


def next_pow2(n):
    return 1 << max(n - 1, 0).bit_length()


def head_dim_pad(head_dim):
    return max(32, next_pow2(head_dim))


def is_causal(window_size):
    """Whether flash-attn's (left, right) window (-1: unbounded) is causal attention: no left bound, right at 0."""
    return window_size[0] < 0 and window_size[1] == 0


def windowed(window_size):
    """Whether (left, right) is a sliding window: a bound that neither full nor causal attention has."""
    return not (window_size[0] < 0 and window_size[1] in (-1, 0))


def window_keys(window_size):
    """The most keys a row sees under (left, right): left + right + 1 where both sides are bounded, else 2**31."""
    left, right = window_size
    return left + right + 1 if left >= 0 and right >= 0 else 1 << 31
