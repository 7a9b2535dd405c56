"""Paired turns on one decode shape: each turn times flashtile, SDPA's cuDNN and any extra flashtile configs (do_bench
median, eager, the order rotating every turn), so a slow stretch of the machine weighs on all of them. Prints, per
candidate, the median of its per-turn ratios cuDNN / candidate, a bootstrap 95 % interval of that median and the turns
it won; --show-turns adds every turn's µs.

    PYTHONPATH=. python scripts/decode_paired.py [--shapes 32 32768 32 131072] [--turns 20] [--layouts head key]
        [--configs block_n warps stages key_groups splits heads ...]   (splits 0: automatic)
"""
import argparse
import functools
import random
import statistics

import torch

from flashtile import ops
from flashtile.bench.__main__ import bench_ms
from flashtile.bench.decode import peers
from flashtile.configs import DecodeConfig


def paired(fns, turns):
    """{name: [µs per turn]}, each turn starting one name later."""
    names, times = list(fns), {name: [] for name in fns}
    for turn in range(turns):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            times[name].append(bench_ms(fns[name]) * 1e3)
    return times


def interval(ratios, draws=4000, seed=0):
    """Bootstrap 95 % interval of the median of ``ratios``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws)]


def candidates(batch, seqlen, layout, configs):
    fns = peers(batch, seqlen, layout=layout)
    fns = {"flashtile": fns["flashtile"], "cuDNN": fns["cuDNN"]}
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    shape = (batch, 8, seqlen, 128) if layout == "head" else (batch, seqlen, 8, 128)
    kc, vc = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if layout == "head":
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    for c in configs:
        fns["/".join(map(str, c))] = functools.partial(
            ops.kvcache_forward, q, kc, vc, seqlens, None, None, seqlen, 128 ** -0.5, (-1, -1), c[4],
            config=DecodeConfig(*c[:4], heads=c[5]), want_lse=False)
    return fns


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, nargs="+", default=[32, 32768, 32, 131072], help="B L, flat")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--layouts", nargs="+", default=["head"], choices=["head", "key"])
    parser.add_argument("--configs", type=int, nargs="*", default=[])
    parser.add_argument("--show-turns", action="store_true")
    args = parser.parse_args()
    configs = list(zip(*[iter(args.configs)] * 6))
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: {args.turns} turns; extra configs "
          "block_n/warps/stages/key_groups/splits/heads\n")
    print("| layout | B | L | candidate | median µs | median cuDNN / candidate | 95 % interval | turns won |")
    print("|---|---|---|---|---|---|---|---|")
    for layout in args.layouts:
        for batch, seqlen in zip(args.shapes[::2], args.shapes[1::2]):
            fns = candidates(batch, seqlen, layout, configs)
            for fn in fns.values():
                fn()
            times = paired(fns, args.turns)
            for name, us in times.items():
                ratios = [c / t for c, t in zip(times["cuDNN"], us)]
                lo, hi = interval(ratios)
                print(f"| {layout} | {batch} | {seqlen} | {name} | {statistics.median(us):.1f} | "
                      f"{statistics.median(ratios):.4f} | {lo:.4f}-{hi:.4f} | {sum(r > 1 for r in ratios)}/{len(us)} |"
                      + (" " + " ".join(f"{t:.1f}" for t in us) if args.show_turns else ""), flush=True)
            del fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
