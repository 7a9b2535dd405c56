"""One eager forward + backward of flashtile inside a profiler window, for Nsight Compute on the device (issue 36:
where the sm90 backward's warps stall):

    ncu --clock-control none --profile-from-start off --set full --import-source yes -k regex:dkdv -o bwd \
        python scripts/ncu_bwd.py --seqlen 16384 --head-dim 128
    ncu --import bwd.ncu-rep --page source --csv --print-source sass > bwd-sass.csv
    python scripts/ncu_stalls.py bwd-sass.csv 25

``--peer FA4`` runs FA4's instead (flashtile.bench.peers; flash_attn.cute installed as ../shared/anchors/FA4.md says).
"""
import argparse

import torch

from flashtile.bench.__main__ import HIDDEN, TOKENS
from flashtile.bench.peers import FORWARD


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--peer", choices=["flashtile", "FA4"], default="flashtile")
    args = parser.parse_args()
    n, d = args.seqlen, args.head_dim
    prepare, attention = FORWARD[args.peer](args.causal)
    q, k, v = (t.requires_grad_() for t in prepare(*(torch.randn(TOKENS // n, n, HIDDEN // d, d, device="cuda",
                                                                 dtype=torch.bfloat16) for _ in range(3))))
    dout = torch.randn_like(q)

    def step():
        torch.autograd.grad(attention(q, k, v), (q, k, v), dout)
    for _ in range(3):  # compile and warm up outside the window
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
