"""The benchmark's input distributions: a kernel whose speed depends on the values shows it on one of these.

- ``random``: q, k, v standard normal (scores of order 1);
- ``large``: the same times 4 (scores 16 times larger: large logits);
- ``rising``: scores rise along the keys, a row's maximum about 60 nats above its first keys' (recency-biased heads,
  long-context positional effects);
- ``falling``: the same ramp reversed (the first keys hold each row's maximum);
- ``dominant``: one key per sequence (the middle one) scores about 60 nats above every other.
"""
import math

import torch

KINDS = ("random", "large", "rising", "falling", "dominant")
RISE = 60.0  # nats between a row's first and last keys' scores (rising, falling) or above the rest (dominant)


def make(kind, batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16, nheads_k=None):
    """(q, k, v) of shape (batch, seqlen, heads, head_dim) drawn as ``kind`` says, with softmax_scale 1/sqrt(head_dim)
    in mind: a shared direction e (all ones) in q and a ramp of e along the keys shifts score j by ramp_j · sqrt(D)."""
    if kind not in KINDS:
        raise ValueError(f"inputs must be one of {', '.join(KINDS)}, not {kind!r}")
    nheads_k = nheads_k or nheads
    q = torch.randn(batch, seqlen, nheads, head_dim, device=device)
    k = torch.randn(batch, seqlen, nheads_k, head_dim, device=device)
    v = torch.randn(batch, seqlen, nheads_k, head_dim, device=device)
    if kind == "large":
        q, k = q * 4, k * 4
    elif kind != "random":
        q = q + 1.0  # q · e = head_dim on average
        position = torch.arange(seqlen, device=device, dtype=torch.float32)
        if kind == "dominant":
            ramp = (position == seqlen // 2).float()
        else:
            ramp = position / max(seqlen - 1, 1)
            ramp = ramp if kind == "rising" else 1 - ramp
        k = k + (RISE / math.sqrt(head_dim)) * ramp[None, :, None, None]  # score += RISE · ramp (q · e / sqrt(D))
    return q.to(dtype), k.to(dtype), v.to(dtype)
