"""One forward of flashtile and of a peer (SDPA's cuDNN by default) inside a profiler window, for Nsight
Compute on the device (docs/perf/forward.md, v10):

    ncu --clock-control none --profile-from-start off --set full --import-source yes -o fwd \
        python scripts/ncu_fwd.py --seqlen 8192 --head-dim 128
"""
import argparse

import torch

from flashtile.bench.__main__ import HIDDEN, TOKENS
from flashtile.bench.peers import FORWARD


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--peers", nargs="+", default=["flashtile", "cuDNN"], choices=list(FORWARD))
    args = parser.parse_args()
    n, d = args.seqlen, args.head_dim
    q, k, v = (torch.randn(TOKENS // n, n, HIDDEN // d, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    runs = []
    for peer in args.peers:
        prepare, run = FORWARD[peer](args.causal)
        inputs = prepare(q, k, v)
        for _ in range(3):  # compile, autotune and warm up outside the window
            run(*inputs)
        runs.append((run, inputs))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for run, inputs in runs:
        run(*inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
