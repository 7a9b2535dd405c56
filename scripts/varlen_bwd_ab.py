"""Packed sequences' forward + backward, two ways of running it in one process, taking turns: flash_attn_varlen_func,
bf16, 16k tokens in sequences of one length or of ragged lengths, H·D = 2048; do_bench medians.

- ``--compare portable`` (default): the sm90 one pass against the portable backward that served packed sequences
  before (v10 in docs/perf/backward.md), with the largest |dq| difference between them.
- ``--compare memsets``: the rows no sequence owns zeroed by one launch after the kernels (as shipped:
  ops.launch_zero_unused_grads) against the way before it (dk and dv zeroed whole, then dq's unused rows); the last
  column is the two memsets' bytes over the H200's 4.8 TB/s, what the change should save.

    PYTHONPATH=. python3 scripts/varlen_bwd_ab.py [--compare portable|memsets] [--rounds 3]
"""
import argparse
from unittest import mock

import torch
from bwd_ab import median_ms

import flashtile
from flashtile import configs, ops
from flashtile.kernels.portable.packed import launch_zero_unused_rows

LENGTHS = {"8 x 2k": [2048] * 8, "32 x 512": [512] * 32,
           "ragged": [300, 4000, 1700, 64, 5000, 2100, 2920, 300]}  # 16,384 tokens each


def _zero_whole(dq, dk, dv, cu_seqlens_q, cu_seqlens_k):
    """The backward's zeroing before run 63: dk and dv whole, dq's rows past the last sequence."""
    dk.zero_()
    dv.zero_()
    launch_zero_unused_rows(dq, cu_seqlens_q)


def _ways(compare):
    """{name: context manager factory} of the two ways to run a step."""
    if compare == "portable":
        return {"sm90": lambda: mock.patch.object(configs, "BWD_BACKEND", "auto"),
                "portable": lambda: mock.patch.object(configs, "BWD_BACKEND", "portable")}
    return {"one launch": lambda: mock.patch.object(ops, "launch_zero_unused_grads", ops.launch_zero_unused_grads),
            "memsets": lambda: mock.patch.object(ops, "launch_zero_unused_grads", _zero_whole)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=["portable", "memsets"], default="portable")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways = _ways(args.compare)
    first, second = ways
    last = "max |sm90 − portable| dq" if args.compare == "portable" else "predicted µs saved"
    print(f"| D | causal | sequences | {first} ms | {second} ms | {second} / {first} time | {last} |")
    print("|---|---|---|---|---|---|---|")
    for head_dim in (64, 128):
        for causal in (False, True):
            for name, seqlens in LENGTHS.items():
                nheads, total = 2048 // head_dim, sum(seqlens)
                cu = torch.tensor([0] + seqlens, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
                q, k, v, dout = (torch.randn(total, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                                 for _ in range(4))
                leaves = [t.requires_grad_() for t in (q, k, v)]
                grads = {}

                def step(way):
                    with ways[way]():
                        out = flashtile.flash_attn_varlen_func(*leaves, cu, cu, max(seqlens), max(seqlens),
                                                               causal=causal)
                        grads[way] = torch.autograd.grad(out, leaves, dout)
                ms = median_ms({way: (lambda w=way: step(w)) for way in ways}, args.rounds)
                if args.compare == "portable":
                    extra = f"{(grads[first][0].float() - grads[second][0].float()).abs().max().item():.2g}"
                else:
                    extra = f"{2 * k.numel() * k.element_size() / 4.8e12 * 1e6:.0f}"
                print(f"| {head_dim} | {causal} | {name} | {ms[first]:.3f} | {ms[second]:.3f} | "
                      f"{ms[second] / ms[first]:.3f} | {extra} |", flush=True)


if __name__ == "__main__":
    main()
