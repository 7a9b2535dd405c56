"""Forward v42 (docs/perf/forward.md): the frozen reference's rounding error against the exact online softmax's,
emulated on the CPU in float32 with P rounded to bf16 for P·V (128-key tiles, B·H = 4, random bf16 inputs against a
float64 reference). "rsum" also takes l from the rounded P. Prints the worst max-error ratio and the mean-error ratio.

    PYTHONPATH=. python scripts/frozen_max_error.py
"""
import math

import torch

from flashtile import reference
from flashtile.kernels.common.online_softmax import LOG2E


def emulate(q, k, v, mode, block_n=128):
    """O of q, k, v [H, N, D] (float64 holding bf16 values): "exact" (each tile's row maxima), "frozen" (the first
    tile's for every tile) or "rsum" (frozen, l summed over the bf16-rounded P)."""
    heads, seqlen_q, head_dim = q.shape
    qk_scale = LOG2E.value / math.sqrt(head_dim)
    s = q.float() @ k.float().transpose(1, 2)
    m_i = torch.full((heads, seqlen_q), -math.inf)
    l_i = torch.zeros(heads, seqlen_q)
    acc = torch.zeros(heads, seqlen_q, head_dim)
    m_ref = None
    for start in range(0, k.shape[1], block_n):
        tile = s[:, :, start:start + block_n]
        if mode != "exact" and start > 0:
            p, alpha = torch.exp2(tile * qk_scale - m_ref[..., None]), torch.ones(heads, seqlen_q)
        else:
            m_new = torch.maximum(m_i, tile.max(-1).values * qk_scale)
            p, alpha, m_i = torch.exp2(tile * qk_scale - m_new[..., None]), torch.exp2(m_i - m_new), m_new
            m_ref = m_i if start == 0 else m_ref
        p16 = p.bfloat16().float()
        l_i = l_i * alpha + (p16 if mode == "rsum" else p).sum(-1)
        acc = acc * alpha[..., None] + p16 @ v[:, start:start + block_n].float()
    return (acc / l_i[..., None]).bfloat16().double()


def main():
    torch.manual_seed(0)
    print("| D | Nq x Nk | q scale | frozen: worst max ratio, mean ratio | rsum: worst max ratio, mean ratio |")
    print("|---|---|---|---|---|")
    for head_dim in (64, 128):
        for (seqlen_q, seqlen_k), scale in (((1023, 1023), 1), ((1500, 700), 1), ((4096, 4096), 1), ((4096, 4096), 3)):
            ratios = {"frozen": [], "rsum": []}
            for _ in range(4):
                q = (torch.randn(4, seqlen_q, head_dim) * scale).bfloat16().double()
                k, v = (torch.randn(4, seqlen_k, head_dim).bfloat16().double() for _ in range(2))
                ref = reference.attention(*(t.transpose(0, 1)[None] for t in (q, k, v)))[0][0].transpose(0, 1)
                exact = (emulate(q, k, v, "exact") - ref).abs()
                for mode, found in ratios.items():
                    err = (emulate(q, k, v, mode) - ref).abs()
                    found.append((err.max().item() / exact.max().item(), err.mean().item() / exact.mean().item()))
            cells = [f"{max(r[0] for r in found):.2f}, {sum(r[1] for r in found) / len(found):.3f}"
                     for found in ratios.values()]
            print(f"| {head_dim} | {seqlen_q} x {seqlen_k} | {scale} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
