"""Eager calls of the small-call shapes with each replayed launch's descriptors encoded once per address
(kernels/common/replay.py, _RawLaunch.encode) or encoded on every call, in one process, taking turns: µs per call of
back-to-back calls, forward alone and forward + backward. Run on the GPU: ``PYTHONPATH=. python
scripts/desc_cache_ab.py``."""
import contextlib
import statistics
from unittest import mock

import torch

from flashtile.bench.small_calls import SHAPES, peers, per_call_us
from flashtile.kernels.common import replay


def main(rounds=7, calls=200):
    print("| B | N | H | D | causal | pass | kept µs | every call µs | kept / every call |")
    print("|---|---|---|---|---|---|---|---|---|")
    for batch, seqlen, nheads, head_dim, causal in SHAPES:
        for backward in (False, True):
            step = peers(batch, seqlen, nheads, head_dim, causal, backward)["flashtile"]
            step()
            seen = {"kept": [], "every": []}
            for turn in range(rounds):
                for mode in (("kept", "every") if turn % 2 == 0 else ("every", "kept")):
                    with contextlib.ExitStack() as stack:
                        if mode == "every":
                            stack.enter_context(mock.patch.object(
                                replay._RawLaunch, "encode", lambda self, slot, desc, meta: self.expand(desc, meta)))
                        seen[mode].append(per_call_us(step, calls, torch.cuda.synchronize))
            on, off = statistics.median(seen["kept"]), statistics.median(seen["every"])
            print(f"| {batch} | {seqlen} | {nheads} | {head_dim} | {causal} | {'fwd+bwd' if backward else 'fwd'} | "
                  f"{on:.1f} | {off:.1f} | {on / off:.2f} |", flush=True)


if __name__ == "__main__":
    main()
