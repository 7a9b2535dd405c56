"""The online-softmax step shared by every kernel: one tile of scores folded into a running
max ``m_i`` and denominator ``l_i``, in the exp2 domain (log2(e) is folded into ``qk_scale``)."""
import torch
import triton
import triton.language as tl

from ...checks import interpreter_enabled

LOG2E = tl.constexpr(1.4426950408889634)  # natural-log units to log2 units; every kernel takes it from here
LN2 = tl.constexpr(0.6931471805599453)  # and back
TWO_LOG2E = tl.constexpr(2 * LOG2E.value)


@triton.jit
def online_softmax_step(m_i, l_i, qk, qk_scale, MAY_BE_EMPTY: tl.constexpr, AXIS: tl.constexpr = 1):
    """Fold the raw scores ``qk`` [BLOCK_M, BLOCK_N] into the running statistics (their keys along AXIS: 2 for
    [groups, BLOCK_M, BLOCK_N] scores, each group of keys with its own statistics).

    Returns ``p`` = exp2(qk·qk_scale − m_new) [BLOCK_M, BLOCK_N], ``alpha`` = exp2(m_i − m_new) (the
    factor that rescales what was accumulated so far), ``m_new`` and ``l_new``. Masked scores are −inf;
    with ``MAY_BE_EMPTY`` a row whose scores are all −inf so far keeps p = 0 and l = 0 instead of NaN.
    """
    m_new = tl.maximum(m_i, tl.max(qk, AXIS) * qk_scale)  # [BLOCK_M]
    if MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    m_col = tl.expand_dims(m_ref, AXIS)
    p = tl.math.exp2(qk * qk_scale - m_col)  # [BLOCK_M, BLOCK_N]
    alpha = tl.math.exp2(m_i - m_ref)  # [BLOCK_M]
    l_new = l_i * alpha + tl.sum(p, AXIS)
    return p, alpha, m_new, l_new


@triton.jit
def fold_sink(m_i, l_i, sink):
    """A row's statistics with one more logit ``sink`` (a learned attention sink, in the same log2 units as ``m_i``)
    that joins the denominator but carries no value: returns ``alpha`` (the factor O's accumulator takes), ``m_new``
    and ``l_new``. A row with nothing to attend to (m_i = −inf, l_i = 0) gets l = 1 and O = 0; a sink of −inf leaves
    the row as it was."""
    m_new = tl.maximum(m_i, sink)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    return alpha, m_new, l_i * alpha + tl.math.exp2(sink - m_ref)


def softcap_mode(device, softcap):
    """A launch's SOFTCAP constexpr: 0 without a cap; 2 where the GPU has the tanh instruction (CUDA, sm75 on), so that
    the sm90 kernels and the portable ones compute the same scores; else 1 (the interpreter, older GPUs)."""
    if not softcap:
        return 0
    fast = not interpreter_enabled() and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (7, 5)
    return 2 if fast else 1


@triton.jit
def tanh(x, FAST: tl.constexpr = False):
    """tanh of float32 ``x``: with FAST one multi-function-unit instruction (tanh.approx.f32, within 2^-11 relative),
    else from one exp2 and a reciprocal: 1 − 2 / (e^(2x) + 1), exact ±1 in the tails."""
    if FAST:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 - 2.0 / (tl.math.exp2(x * TWO_LOG2E) + 1.0)


@triton.jit
def capped_grad(p, lse, inv_qk_scale):
    """1 − tanh² of a softcapped score (its derivative up to the constant scale, as modified_scores's) from its
    probability p = exp2(tanh · qk_scale − lse), lse in log2 units broadcast like p: no tile of tanh kept alive
    between the two products of a backward step. 0 where p is 0."""
    t = (tl.math.log2(p) + lse) * inv_qk_scale
    return tl.where(p > 0, 1.0 - t * t, 0.0)


@triton.jit
def modified_scores(qk, softcap_scale, slope, dist, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """flash-attn's softcap and ALiBi on raw scores q·k, in the units qk_scale then turns into log2 logits:
    tanh(q·k · softcap_scale) with SOFTCAP (qk_scale carries the cap), then minus slope · dist with HAS_ALIBI
    (dist = |i + seqlen_k − seqlen_q − j|, slope already in those units; SOFTCAP as softcap_mode gives it). Also
    returns d(score)/d(q·k) up to the constant scale: 1 − tanh² with SOFTCAP, else 1."""
    dscore = 1.0
    if SOFTCAP:
        qk = tanh(qk * softcap_scale, SOFTCAP == 2)
        dscore = 1.0 - qk * qk
    if HAS_ALIBI:
        qk -= slope * dist
    return qk, dscore


@triton.jit
def alibi_slope(Alibi, b, stride_alibi_b, head, alibi_unit, HAS_ALIBI: tl.constexpr, mask=True):
    """Sequence b's ALiBi slope of ``head`` (a scalar or a vector of heads), in logit units; 0 without ALiBi."""
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Alibi + b.to(tl.int64) * stride_alibi_b + head, mask=mask, other=0.0) * alibi_unit
    return slope


def score_scales(softmax_scale, softcap):
    """(qk_scale, softcap_scale, alibi_unit) for a kernel using modified_scores: log2 logits are
    qk_scale · score, with softcap the tanh's argument is q·k · softcap_scale, and ALiBi slopes are divided by the
    logit unit (the cap, else the softmax scale)."""
    unit = softcap if softcap else softmax_scale
    return unit * LOG2E.value, (softmax_scale / softcap if softcap else 0.0), 1.0 / unit
