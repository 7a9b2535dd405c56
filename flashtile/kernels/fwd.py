"""FlashAttention-2 forward, portable Triton.

One program owns a Q tile (BLOCK_M query rows of one head): it loads the tile once, streams the K/V
tiles its rows may see, keeps the running max ``m_i``, denominator ``l_i`` and accumulator ``acc`` in
registers, and writes O once, normalized, with the row log-sum-exp (natural log) beside it.

Masking (causal, sliding window, ragged tails) costs only on the tiles that cross a boundary: the key
range of a Q tile is split into [lo, full_lo) masked, [full_lo, full_hi) unmasked, [full_hi, hi) masked.
"""
import triton
import triton.language as tl

from .online_softmax import online_softmax_step

LN2 = 0.6931471805599453


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, lo, hi, offs_m, diag, left, right, seqlen_k,
                  qk_scale, MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = k_desc.load([start_n, 0])  # [BLOCK_N, HEAD_DIM]
        qk = tl.dot(q, k.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if MASKED:
            cols = (start_n + offs_n)[None, :]
            ok = cols < seqlen_k
            if MASK_RIGHT:
                ok &= cols <= (offs_m + diag + right)[:, None]
            if MASK_LEFT:
                ok &= cols >= (offs_m + diag - left)[:, None]
            qk = tl.where(ok, qk, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, qk, qk_scale, MASKED)
        v = v_desc.load([start_n, 0])  # [BLOCK_N, HEAD_DIM]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM]
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(
    Q, K, V, O, LSE, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, nheads, group, qk_scale, left, right,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr,
    MASK_RIGHT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Q tiles with the most keys (the last ones, under a causal mask) are launched first.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // nheads).to(tl.int64)
    h = (pid_bh % nheads).to(tl.int64)
    h_k = h // group
    q_start = tl.zeros([], tl.int64)
    k_start = tl.zeros([], tl.int64)
    if IS_VARLEN:
        q_start = tl.load(cu_seqlens_q + b).to(tl.int64)
        k_start = tl.load(cu_seqlens_k + b).to(tl.int64)
        seqlen_q = (tl.load(cu_seqlens_q + b + 1) - q_start).to(tl.int32)
        seqlen_k = (tl.load(cu_seqlens_k + b + 1) - k_start).to(tl.int32)
    start_m = pid_m * BLOCK_M
    if start_m < seqlen_q:
        q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + q_start * stride_qn + h * stride_qh,
                                           shape=[seqlen_q, HEAD_DIM], strides=[stride_qn, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM_PAD])
        k_desc = tl.make_tensor_descriptor(K + b * stride_kb + k_start * stride_kn + h_k * stride_kh,
                                           shape=[seqlen_k, HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM_PAD])
        v_desc = tl.make_tensor_descriptor(V + b * stride_vb + k_start * stride_vn + h_k * stride_vh,
                                           shape=[seqlen_k, HEAD_DIM], strides=[stride_vn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM_PAD])
        o_desc = tl.make_tensor_descriptor(O + b * stride_ob + q_start * stride_on + h * stride_oh,
                                           shape=[seqlen_q, HEAD_DIM], strides=[stride_on, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM_PAD])

        diag = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
        lo = 0
        hi = seqlen_k
        full_lo = 0
        full_hi = seqlen_k // BLOCK_N * BLOCK_N
        if MASK_LEFT:
            lo = tl.maximum(start_m + diag - left, 0) // BLOCK_N * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + diag - left, 0), BLOCK_N) * BLOCK_N
        if MASK_RIGHT:
            hi = tl.minimum(hi, start_m + BLOCK_M + diag + right)
            full_hi = tl.minimum(seqlen_k, tl.maximum(start_m + diag + right + 1, 0)) // BLOCK_N * BLOCK_N
        hi = tl.maximum(hi, lo)
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        q = q_desc.load([start_m, 0])  # [BLOCK_M, HEAD_DIM]

        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, lo, full_lo, offs_m, diag, left,
                                      right, seqlen_k, qk_scale, True, MASK_LEFT, MASK_RIGHT, BLOCK_N,
                                      DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, full_lo, full_hi, offs_m, diag,
                                      left, right, seqlen_k, qk_scale, False, MASK_LEFT, MASK_RIGHT,
                                      BLOCK_N, DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, full_hi, hi, offs_m, diag, left,
                                      right, seqlen_k, qk_scale, True, MASK_LEFT, MASK_RIGHT, BLOCK_N,
                                      DOT_PRECISION)

        empty = l_i == 0.0  # a row with nothing to attend to: O = 0, LSE = -inf
        acc = acc * (1.0 / tl.where(empty, 1.0, l_i))[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
        o_desc.store([start_m, 0], acc.to(O.dtype.element_ty))
        lse_ptrs = LSE + b * stride_lb + h * stride_lh + q_start + offs_m
        tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)


def launch_fwd(q, k, v, out, lse, strides, seqlen_q, seqlen_k, max_seqlen_q, batch, cu_seqlens_q,
               cu_seqlens_k, softmax_scale, window_size, bottom_right, config):
    """Launch the forward on prepared tensors. ``strides`` holds (batch, token, head) strides of q, k,
    v, out and (batch, head) of lse; in packed (varlen) mode the batch strides are 0."""
    nheads, head_dim = q.shape[-2], q.shape[-1]
    left, right = window_size
    is_varlen = cu_seqlens_q is not None
    grid = (triton.cdiv(max_seqlen_q, config.block_m), batch * nheads)
    flash_fwd_kernel[grid](
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *strides,
        seqlen_q, seqlen_k, nheads, nheads // k.shape[-2], softmax_scale * 1.4426950408889634,
        max(left, 0), max(right, 0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        IS_VARLEN=is_varlen, BOTTOM_RIGHT=bottom_right, MASK_LEFT=left >= 0, MASK_RIGHT=right >= 0,
        DOT_PRECISION="ieee" if q.dtype.itemsize == 4 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
