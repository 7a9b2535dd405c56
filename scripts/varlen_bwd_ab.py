"""Packed sequences' backward on the sm90 one pass against the portable backward that served them before (v10 in
docs/perf/backward.md), in one process, taking turns: flash_attn_varlen_func forward + backward, bf16, 16k tokens in
sequences of one length or of ragged lengths, H·D = 2048; do_bench medians.

    PYTHONPATH=. python3 scripts/varlen_bwd_ab.py [--rounds 3]
"""
import argparse

import torch
from bwd_ab import median_ms

import flashtile
from flashtile import configs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lengths = {"8 x 2k": [2048] * 8, "ragged": [300, 4000, 1700, 64, 5000, 2100, 2920, 300]}  # 16,384 tokens each
    print("| D | causal | sequences | sm90 ms | portable ms | portable / sm90 time | max |sm90 − portable| dq |")
    print("|---|---|---|---|---|---|---|")
    for head_dim in (64, 128):
        for causal in (False, True):
            for name, seqlens in lengths.items():
                nheads, total = 2048 // head_dim, sum(seqlens)
                cu = torch.tensor([0] + seqlens, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
                q, k, v, dout = (torch.randn(total, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                                 for _ in range(4))
                leaves = [t.requires_grad_() for t in (q, k, v)]
                grads = {}

                def step(backend):
                    configs.BWD_BACKEND = backend
                    out = flashtile.flash_attn_varlen_func(*leaves, cu, cu, max(seqlens), max(seqlens),
                                                           causal=causal)
                    grads[backend] = torch.autograd.grad(out, leaves, dout)
                ms = median_ms({backend: (lambda b=backend: step(b)) for backend in ("auto", "portable")},
                               args.rounds)
                configs.BWD_BACKEND = "auto"
                diff = (grads["auto"][0].float() - grads["portable"][0].float()).abs().max().item()
                print(f"| {head_dim} | {causal} | {name} | {ms['auto']:.3f} | {ms['portable']:.3f} | "
                      f"{ms['portable'] / ms['auto']:.3f} | {diff:.2g} |", flush=True)


if __name__ == "__main__":
    main()
