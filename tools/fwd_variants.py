"""Time the forward of flashtile against its peers in one process, for A/B runs of a kernel change (run once
per variant of the source tree, in one device call; docs/perf/forward.md, v14):

    PYTHONPATH=. python tools/fwd_variants.py LABEL --head-dim 64 --seqlens 1024 2048 4096 16384 --hopper-everywhere

One markdown row per (mask, N): TFLOP/s, do_bench median, best of --rounds turns, B·N = 16k tokens, 2048 / D heads
(--batch and --heads set others: the shape goes into the row).
--hopper-everywhere runs the Hopper kernel at every length: the shipped config without its min_seqlen_q, and for
a causal head dim without one, two consumer warpgroups of 128-row tiles on a persistent grid. --set FIELD=VALUE
(integers; 0/1 for switches) changes those configs' fields, e.g. `--set num_stages=2` (`below.o_tma=1` changes the
config below min_seqlen_q). Config variants of one source tree take turns with the peers in one process, one column
each, each round starting one column later (at N=1k the column right after cuDNN's turn measured 3-5 % high;
docs/perf/forward.md, v16 and v26):

    PYTHONPATH=. python tools/fwd_variants.py LABEL --masks causal --peers cuDNN --variant shipped \
        --variant overlap overlap_pv=1 --variant "non-persistent" persistent=0
"""
import argparse
import dataclasses
import itertools

import torch
import triton

from flashtile import configs
from flashtile.bench.peers import FORWARD


def variant_configs(table, head_dim, everywhere, settings):
    """{(head_dim, causal): config} to put into configs.FWD_HOPPER: ``table``'s entries with ``settings``
    ("field=int" strings) applied, and with ``everywhere`` no min_seqlen_q (a causal head dim without an entry
    gets two consumer warpgroups of 128-row tiles, persistent)."""
    fields = {name: int(value) for name, value in (item.split("=") for item in settings)}
    below = {name[len("below."):]: value for name, value in fields.items() if name.startswith("below.")}
    fields = {name: value for name, value in fields.items() if not name.startswith("below.")}
    out = {}
    for causal in (False, True):
        cfg = table.get((head_dim, causal))
        if everywhere:
            cfg = (dataclasses.replace(cfg, min_seqlen_q=0) if cfg else
                   configs.HopperFwdConfig(block_m=128, block_n=128, num_stages=3, persistent=True))
        if cfg is not None:
            extra = {"below": dataclasses.replace(cfg.below, **below)} if below and cfg.below is not None else {}
            out[(head_dim, causal)] = dataclasses.replace(cfg, **fields, **extra)
    return out


def variant_tables(table, head_dim, everywhere, settings, variants):
    """{name: configs to put into configs.FWD_HOPPER} for ``variants`` ([name, "field=int", ...] lists), each
    with its own fields changed on top of ``settings``."""
    return {name: variant_configs(table, head_dim, everywhere, settings + fields) for name, *fields in variants}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("label")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 16384])
    parser.add_argument("--masks", nargs="+", default=["full"], choices=["full", "causal"])
    parser.add_argument("--peers", nargs="+", default=["flashtile", "cuDNN"], choices=list(FORWARD))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hopper-everywhere", action="store_true")
    parser.add_argument("--heads", type=int, nargs="+", default=[], help="query heads (default 2048 / D), a row each")
    parser.add_argument("--batch", type=int, default=0, help="sequences (default 16384 / N)")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar=("NAME", "FIELD=VALUE"),
                        help="a flashtile column with these fields changed on top of --set (repeatable)")
    args = parser.parse_args()
    d = args.head_dim
    base = dict(configs.FWD_HOPPER)
    tables = variant_tables(base, d, args.hopper_everywhere, args.set, args.variant)
    configs.FWD_HOPPER.update(variant_configs(base, d, args.hopper_everywhere, args.set))
    columns = list(tables) + args.peers
    for mask in args.masks:
        causal = mask == "causal"
        for n, heads in itertools.product(args.seqlens, args.heads or [2048 // d]):
            q, k, v = (torch.randn(args.batch or max(1, 16384 // n), n, heads, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            flops = 4 * q.shape[0] * q.shape[2] * n * n * d / (2 if causal else 1)
            best = {}
            for turn in range(args.rounds):  # variants and peers take turns, each round starting one column later
                for name in columns[turn % len(columns):] + columns[:turn % len(columns)]:
                    prepare, run = FORWARD["flashtile" if name in tables else name](causal)
                    inputs = prepare(q, k, v)
                    saved = dict(configs.FWD_HOPPER)
                    configs.FWD_HOPPER.update(tables.get(name, {}))
                    ms = triton.testing.do_bench(lambda: run(*inputs), warmup=25, rep=100)
                    configs.FWD_HOPPER.update(saved)
                    best[name] = max(best.get(name, 0.0), flops / ms / 1e9)
            shape = f"{n}" if not args.heads and not args.batch else f"{n} (B={q.shape[0]}, H={heads})"
            print(f"| {args.label} | {mask} | {shape} | " + " | ".join(f"{best[c]:.0f}" for c in columns) + " |",
                  flush=True)
        print(f"(columns: {', '.join(columns)})", flush=True)

if __name__ == "__main__":
    main()
