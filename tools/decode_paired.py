"""Paired turns on one decode shape: each turn times flashtile, SDPA's cuDNN and any extra flashtile configs (do_bench
median, eager, the order rotating every turn: bench.__main__.every_turn), so a slow stretch of the machine weighs on
all of them. Prints, per candidate, the median of its per-turn ratios cuDNN / candidate, a bootstrap 95 % interval of
that median, the turns it won and its largest difference to cuDNN's output; --show-turns adds every turn's µs.

    PYTHONPATH=. python tools/decode_paired.py [--shapes 32 32768 32 131072] [--turns 20] [--layouts head key]
        [--configs block_n warps stages key_groups splits heads ...]   (splits 0: automatic)
"""
import argparse
import functools
import random
import statistics

import torch

from flashtile import ops
from flashtile.bench.__main__ import every_turn
from flashtile.bench.decode import _eager_us, peers
from flashtile.configs import DecodeConfig, from_fields
from tools.decode_read_floor import cache


def interval(ratios, draws=4000, seed=0):
    """Bootstrap 95 % interval of the median of ``ratios``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws)]


def candidates(batch, seqlen, layout, configs):
    """{name: fn}: the bench's flashtile and cuDNN, then each config on a cache of the same layout."""
    fns = peers(batch, seqlen, layout=layout)
    fns = {"flashtile": fns["flashtile"], "cuDNN": fns["cuDNN"]}
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (cache(batch, seqlen, layout) for _ in range(2))
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    for c in configs:
        fns["/".join(map(str, c))] = functools.partial(
            ops.kvcache_forward, q, kc, vc, seqlens, None, None, seqlen, 128 ** -0.5, (-1, -1), c[4],
            config=from_fields(DecodeConfig, (*c[:4], c[5])), want_lse=False)
    return fns, (q, kc, vc)


def config_error(fn, q, kc, vc):
    """Largest |output - cuDNN's| of a config candidate on its own inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), scale=128 ** -0.5, enable_gqa=True)
    return (fn()[0].float() - ref.transpose(1, 2).float()).abs().max().item()


HEADER = ("| layout | B | L | candidate | median µs | median cuDNN / candidate | 95 % interval | turns won |\n"
          "|---|---|---|---|---|---|---|---|")


def paired_rows(prefix, fns, turns, show_turns=False):
    """Time ``fns`` (one named "cuDNN") in ``turns`` paired turns and print a HEADER row per candidate after
    ``prefix``: its median µs, the median of its per-turn ratios cuDNN / candidate with a bootstrap 95 % interval,
    the turns it won (and every turn's µs with ``show_turns``)."""
    results = every_turn({name: functools.partial(_eager_us, fn) for name, fn in fns.items()}, turns)
    times = {name: [t for t, _ in r] for name, r in results.items()}
    for name, us in times.items():
        ratios = [c / t for c, t in zip(times["cuDNN"], us)]
        lo, hi = interval(ratios)
        print(f"{prefix} {name} | {statistics.median(us):.1f} | {statistics.median(ratios):.4f} | {lo:.4f}-{hi:.4f} | "
              f"{sum(r > 1 for r in ratios)}/{len(us)} |" + (" " + " ".join(f"{t:.1f}" for t in us) if show_turns
                                                             else ""), flush=True)


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
    print(HEADER)
    for layout in args.layouts:
        for batch, seqlen in zip(args.shapes[::2], args.shapes[1::2]):
            fns, inputs = candidates(batch, seqlen, layout, configs)
            errors = {name: config_error(fn, *inputs) for name, fn in list(fns.items())[2:]}
            paired_rows(f"| {layout} | {batch} | {seqlen} |", fns, args.turns, args.show_turns)
            if errors:
                print("  max |config - cuDNN|: " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
            del fns, inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
