"""Time the forward of flashtile against its peers in one process, for A/B runs of a kernel change (run once
per variant of the source tree, in one device call; docs/perf.md, forward v14):

    PYTHONPATH=. python scripts/fwd_variants.py LABEL --head-dim 64 --seqlens 1024 2048 4096 16384 --hopper-everywhere

One markdown row per (mask, N): TFLOP/s, do_bench median, best of --rounds turns, B·N = 16k tokens, 2048 / D heads.
--hopper-everywhere runs the Hopper kernel at every length: the shipped config without its min_seqlen_q, and for
a causal head dim without one, two consumer warpgroups of 128-row tiles on a persistent grid. --set FIELD=VALUE
(integers; 0/1 for switches) changes those configs' fields, e.g. `--set num_stages=2`.
"""
import argparse
import dataclasses

import torch
import triton

from flashtile import configs
from flashtile.bench.peers import FORWARD


def variant_configs(table, head_dim, everywhere, settings):
    """{(head_dim, causal): config} to put into configs.FWD_HOPPER: ``table``'s entries with ``settings``
    ("field=int" strings) applied, and with ``everywhere`` no min_seqlen_q (a causal head dim without an entry
    gets two consumer warpgroups of 128-row tiles, persistent)."""
    fields = {name: int(value) for name, value in (item.split("=") for item in settings)}
    out = {}
    for causal in (False, True):
        cfg = table.get((head_dim, causal))
        if everywhere:
            cfg = (dataclasses.replace(cfg, min_seqlen_q=0) if cfg else
                   configs.HopperFwdConfig(128, 128, 3, persistent=True))
        if cfg is not None:
            out[(head_dim, causal)] = dataclasses.replace(cfg, **fields)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("label")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 16384])
    parser.add_argument("--masks", nargs="+", default=["full"], choices=["full", "causal"])
    parser.add_argument("--peers", nargs="+", default=["flashtile", "cuDNN"], choices=list(FORWARD))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hopper-everywhere", action="store_true")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()
    d = args.head_dim
    configs.FWD_HOPPER.update(variant_configs(configs.FWD_HOPPER, d, args.hopper_everywhere, args.set))
    for mask in args.masks:
        causal = mask == "causal"
        for n in args.seqlens:
            q, k, v = (torch.randn(16384 // n, n, 2048 // d, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * q.shape[0] * q.shape[2] * n * n * d / (2 if causal else 1)
            best = {}
            for _ in range(args.rounds):  # peers take turns; each keeps its best median
                for name in args.peers:
                    prepare, run = FORWARD[name](causal)
                    inputs = prepare(q, k, v)
                    ms = triton.testing.do_bench(lambda: run(*inputs), warmup=25, rep=100)
                    best[name] = max(best.get(name, 0.0), flops / ms / 1e9)
            print(f"| {args.label} | {mask} | {n} | " + " | ".join(f"{best[p]:.0f}" for p in args.peers) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
