"""Row softmax three ways, one program per BLOCK_M rows, streaming BLOCK_N columns at a time:

- ``naive_softmax``: sum exp(x), then write exp(x) / sum. Two reads of x; overflows once x > 88.
- ``safe_softmax``: max, then sum exp(x − max), then write. Three reads of x.
- ``online_softmax``: running max and rescaled denominator in one pass, then write. Two reads of x,
  and safe: the step is ``online_softmax_step``, the one FlashAttention uses.
"""
import torch
import triton
import triton.language as tl

from ..kernels.common.online_softmax import online_softmax_step

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _tile(X, offs_m, start_n, n_rows, n_cols, stride, BLOCK_N: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < n_cols)[None, :]
    ptrs = X + offs_m.to(tl.int64)[:, None] * stride + offs_n[None, :]
    return tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32), ptrs, mask


@triton.jit
def softmax_kernel(X, Y, n_rows, n_cols, stride_x, stride_y, METHOD: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # log2 domain
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if METHOD == "safe":  # pass 1 of 3: the row max
        for start_n in range(0, n_cols, BLOCK_N):
            x, _, _ = _tile(X, offs_m, start_n, n_rows, n_cols, stride_x, BLOCK_N)
            m_i = tl.maximum(m_i, tl.max(x, 1) * LOG2E)
    for start_n in range(0, n_cols, BLOCK_N):  # the denominator
        x, _, _ = _tile(X, offs_m, start_n, n_rows, n_cols, stride_x, BLOCK_N)
        if METHOD == "online":
            _, _, m_i, l_i = online_softmax_step(m_i, l_i, x, LOG2E, True)
        elif METHOD == "safe":
            l_i += tl.sum(tl.math.exp2(x * LOG2E - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None]), 1)
        else:
            l_i += tl.sum(tl.math.exp2(x * LOG2E), 1)
    if METHOD == "naive":
        m_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.where(m_i == float("-inf"), 0.0, m_i)  # rows past the end: keep them finite (never stored)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    for start_n in range(0, n_cols, BLOCK_N):  # the write
        x, _, mask = _tile(X, offs_m, start_n, n_rows, n_cols, stride_x, BLOCK_N)
        y = tl.math.exp2(x * LOG2E - m_i[:, None]) / l_i[:, None]
        offs_n = start_n + tl.arange(0, BLOCK_N)
        tl.store(Y + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], y.to(Y.dtype.element_ty), mask=mask)


def _softmax(x, method, block_m=16, block_n=64):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x has dtype {x.dtype}; float16, bfloat16 or float32 expected")
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        softmax_kernel[(-(-x.shape[0] // block_m),)](x, y, x.shape[0], x.shape[1], x.stride(0), y.stride(0),
                                                      METHOD=method, BLOCK_M=block_m, BLOCK_N=block_n)
    return y


def naive_softmax(x):
    return _softmax(x, "naive")


def safe_softmax(x):
    return _softmax(x, "safe")


def online_softmax(x):
    return _softmax(x, "online")
