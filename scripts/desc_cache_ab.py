"""Eager calls of the small-call shapes with each replayed launch's descriptors encoded once per address
(kernels/common/replay.py, _RawLaunch.encode) or encoded on every call, in one process, taking turns: µs per call of
back-to-back calls, forward alone and forward + backward. Run on the GPU: ``PYTHONPATH=. python
scripts/desc_cache_ab.py``."""
import contextlib
from unittest import mock

from bwd_ab import median_us_under

from flashtile.bench.small_calls import SHAPES, peers
from flashtile.kernels.common import replay


def main(rounds=7, calls=200):
    print("| B | N | H | D | causal | pass | kept µs | every call µs | kept / every call |")
    print("|---|---|---|---|---|---|---|---|---|")
    modes = {"kept": contextlib.nullcontext, "every": lambda: mock.patch.object(
        replay._RawLaunch, "encode", lambda self, slot, desc, meta: self.expand(desc, meta))}
    for batch, seqlen, nheads, head_dim, causal in SHAPES:
        for backward in (False, True):
            step = peers(batch, seqlen, nheads, head_dim, causal, backward)["flashtile"]
            step()
            us = median_us_under(step, modes, rounds, calls)
            print(f"| {batch} | {seqlen} | {nheads} | {head_dim} | {causal} | {'fwd+bwd' if backward else 'fwd'} | "
                  f"{us['kept']:.1f} | {us['every']:.1f} | {us['kept'] / us['every']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
