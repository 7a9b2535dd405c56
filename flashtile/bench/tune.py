"""``python -m flashtile.bench.tune``: sweep forward tile configs on the bench grid; the winners go
into flashtile/configs.py by hand, the printed table into docs/perf.md."""
import argparse
import itertools

import torch

from .. import checks, ops
from ..configs import FwdConfig
from .__main__ import TOKENS, HIDDEN, bench_ms, fwd_flops, progress

CANDIDATES = [FwdConfig(bm, bn, w, s) for bm, bn, w, s in [
    (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
    (128, 128, 4, 2), (128, 128, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3)]]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.tune")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    args = parser.parse_args(argv)
    results = {}
    cases = list(itertools.product(args.head_dims, [False, True], args.seqlens, CANDIDATES))
    for d, causal, n, cfg in progress(cases, "tile sweep"):
        b, h = TOKENS // n, HIDDEN // d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        window = checks.window((-1, -1), causal)
        scale = d ** -0.5
        try:
            ms = bench_ms(lambda: ops.attention_forward(q, k, v, scale, window, True, config=cfg), 10, 40)
            results[(d, causal, n, cfg)] = fwd_flops(b, h, n, n, d, causal) / ms / 1e9
        except Exception as err:  # a config that does not fit (shared memory, registers) is skipped
            results[(d, causal, n, cfg)] = None
            print(f"skip {cfg} d{d}: {type(err).__name__}: {str(err).splitlines()[0][:100]}")
    print("| D | causal | BM,BN,warps,stages | " + " | ".join(f"N={n}" for n in args.seqlens) + " | mean |")
    print("|---" * (len(args.seqlens) + 4) + "|")
    for d, causal in itertools.product(args.head_dims, [False, True]):
        scored = []
        for cfg in CANDIDATES:
            vals = [results[(d, causal, n, cfg)] for n in args.seqlens]
            mean = sum(vals) / len(vals) if all(vals) else 0.0
            scored.append((mean, cfg, vals))
        for mean, cfg, vals in sorted(scored, key=lambda s: s[0], reverse=True):
            cells = " | ".join(f"{x:.0f}" if x else "–" for x in vals)
            print(f"| {d} | {'yes' if causal else 'no'} | {cfg.block_m},{cfg.block_n},{cfg.num_warps},"
                  f"{cfg.num_stages} | {cells} | {mean:.0f} |")


if __name__ == "__main__":
    main()
