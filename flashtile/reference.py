"""Naive attention in three stages: scores S, probabilities P, output P·V.

It materializes S and P (O(N²) memory), which makes it the golden oracle of the tests (run it in
float64 on upcast inputs) and the "naive" entry of the benchmark (run it in the input dtype).
Layout is flash-attn's: q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim),
or packed (total, nheads, headdim) with ``cu_seqlens``.
"""
import math

import torch


def allowed_keys(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), bottom_right=True, device=None):
    """Boolean [seqlen_q, seqlen_k]: True where query i may attend to key j.

    Query i sits on the diagonal at key i + (seqlen_k - seqlen_q) (bottom-right, flash-attn) or at
    key i (top-left, PyTorch). ``window_size=(left, right)`` keeps keys within left before and right
    after that diagonal position; -1 means unbounded. ``causal`` is the window (left, 0).
    """
    left, right = window_size
    if causal:
        right = 0
    diag = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q if bottom_right else 0)
    j = torch.arange(seqlen_k, device=device)[None, :]
    ok = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= diag + right
    if left >= 0:
        ok &= j >= diag - left
    return ok


def scores(q, k, softmax_scale):
    """Stage 1: S = scale · Q Kᵀ, [batch, nheads, seqlen_q, seqlen_k]. K heads repeat for GQA/MQA."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2) if group > 1 else k
    return torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale


def softmax_rows(s, allowed, sinks=None):
    """Stage 2: P = softmax(S) over keys where ``allowed``; a row with no allowed key gives P = 0. ``sinks``
    (nheads,): one more logit per head in each row's softmax, with no value (an attention sink).

    Returns P (the keys' columns) and the row log-sum-exp (−inf for an empty row without a sink)."""
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype)[:, None, None].expand(*s.shape[:-1], 1)], -1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    return (p if sinks is None else p[..., :-1]), lse


def weighted_values(p, v, nheads):
    """Stage 3: O = P V, [batch, seqlen_q, nheads, headdim]."""
    group = nheads // v.shape[2]
    v = v.repeat_interleave(group, dim=2) if group > 1 else v
    return torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)


def attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), bottom_right=True,
              upcast=True, softcap=0.0, alibi_slopes=None, sinks=None):
    """Naive attention on (batch, seqlen, nheads, headdim). Returns (out, lse[batch, nheads, seqlen_q]).

    ``upcast=True`` computes in float64 (the oracle) and returns a float64 out; ``upcast=False``
    computes in the inputs' own dtype, as a plain PyTorch user would. ``softcap`` > 0 replaces each
    score s by softcap · tanh(s / softcap) (flash-attn's softcap); ``alibi_slopes`` (nheads,) or (batch,
    nheads) then adds −slope · |i + diag − j| (diag: seqlen_k − seqlen_q bottom-right, else 0). ``sinks``
    (nheads,): a logit per head that joins every row's softmax with no value (softmax_rows).
    """
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
        sinks = None if sinks is None else sinks.double()
    s = scores(q, k, softmax_scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        diag = k.shape[1] - q.shape[1] if bottom_right else 0
        distance = (torch.arange(q.shape[1], device=q.device)[:, None] + diag
                    - torch.arange(k.shape[1], device=q.device)[None, :]).abs()  # [seqlen_q, seqlen_k]
        slopes = alibi_slopes.to(s.dtype).expand(q.shape[0], q.shape[2])  # [batch, nheads]
        s = s - slopes[:, :, None, None] * distance
    allowed = allowed_keys(q.shape[1], k.shape[1], causal, window_size, bottom_right, q.device)
    p, lse = softmax_rows(s, allowed, sinks)
    return weighted_values(p, v, q.shape[2]), lse.float()


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                     window_size=(-1, -1), upcast=True, sinks=None):
    """Naive attention on packed (total, nheads, headdim) sequences. Returns (out, lse[nheads, total_q])."""
    outs, lses = [], []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        o, lse = attention(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                           softmax_scale, causal, window_size, True, upcast, sinks=sinks)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def rotary(x, cos, sin, positions, interleaved):
    """Rotary embedding in float64, spelled out per pair of features: x (batch, seqlen, nheads, headdim),
    cos/sin (seqlen_ro, rotary_dim / 2), positions (batch, seqlen) of each token. Pairs are (2i, 2i + 1) when
    ``interleaved``, else (i, i + rotary_dim / 2); features past rotary_dim are kept."""
    half = cos.shape[1]
    out = x.double().clone()
    c = cos.double()[positions.long()][:, :, None, :]  # [batch, seqlen, 1, half]
    s = sin.double()[positions.long()][:, :, None, :]
    pair = torch.arange(half, device=x.device)
    first, second = (2 * pair, 2 * pair + 1) if interleaved else (pair, pair + half)
    a, b = out[..., first], out[..., second]
    out[..., first], out[..., second] = a * c - b * s, a * s + b * c
    return out
