"""One eager forward + backward of flashtile inside a profiler window, for Nsight Compute on the device (issue 36:
where the sm90 backward's warps stall):

    ncu --clock-control none --profile-from-start off --set full --import-source yes -k regex:dkdv -o bwd \
        python scripts/ncu_bwd.py --seqlen 16384 --head-dim 128
    ncu --import bwd.ncu-rep --page source --csv --print-source sass > bwd-sass.csv
    python scripts/ncu_stalls.py bwd-sass.csv 25

``--peer FA4`` runs FA4's instead (flash_attn.cute, importable as ../shared/anchors/FA4.md installs it).
"""
import argparse

import torch

import flashtile
from flashtile.bench.__main__ import HIDDEN, TOKENS


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--peer", choices=["flashtile", "FA4"], default="flashtile")
    args = parser.parse_args()
    n, d = args.seqlen, args.head_dim
    q, k, v = (torch.randn(TOKENS // n, n, HIDDEN // d, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)

    attention = flashtile.flash_attn_func
    if args.peer == "FA4":
        from flash_attn.cute.interface import flash_attn_func as fa4

        def attention(q, k, v, causal):
            return fa4(q, k, v, causal=causal)[0]

    def step():
        torch.autograd.grad(attention(q, k, v, causal=args.causal), (q, k, v), dout)
    for _ in range(3):  # compile and warm up outside the window
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
