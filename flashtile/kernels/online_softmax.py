"""The online-softmax step shared by every kernel: one tile of scores folded into a running
max ``m_i`` and denominator ``l_i``, in the exp2 domain (log2(e) is folded into ``qk_scale``)."""
import triton
import triton.language as tl


@triton.jit
def online_softmax_step(m_i, l_i, qk, qk_scale, MAY_BE_EMPTY: tl.constexpr):
    """Fold the raw scores ``qk`` [BLOCK_M, BLOCK_N] into the running statistics.

    Returns ``p`` = exp2(qk·qk_scale − m_new) [BLOCK_M, BLOCK_N], ``alpha`` = exp2(m_i − m_new) (the
    factor that rescales what was accumulated so far), ``m_new`` and ``l_new``. Masked scores are −inf;
    with ``MAY_BE_EMPTY`` a row whose scores are all −inf so far keeps p = 0 and l = 0 instead of NaN.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # [BLOCK_M]
    if MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(qk * qk_scale - m_ref[:, None])  # [BLOCK_M, BLOCK_N]
    alpha = tl.math.exp2(m_i - m_ref)  # [BLOCK_M]
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new
