"""Eager forward + backward of short calls with the backward's launches replayed (kernels/common/replay.py) or through
Triton's launcher every call, in one process, taking turns: µs per call of back-to-back calls (the shapes of
``flashtile.bench.small_calls``). Run on the GPU: ``PYTHONPATH=. python scripts/bwd_replay_ab.py``."""
import contextlib
from unittest import mock

from bwd_ab import median_us_under

from flashtile.bench.small_calls import SHAPES, peers
from flashtile.kernels.hopper import bwd as bwd_hopper
from flashtile.kernels.hopper import bwd_dq as bwd_dq_hopper
from flashtile.kernels.portable import bwd


def main(rounds=7, calls=200):
    print("| B | N | H | D | causal | replayed µs | Triton's launcher µs | replayed / launcher |")
    print("|---|---|---|---|---|---|---|---|")
    tables = (bwd._REPLAYS, bwd_hopper._REPLAYS, bwd_dq_hopper._REPLAYS)

    @contextlib.contextmanager
    def launcher():  # no replay found: every call launches through Triton
        with contextlib.ExitStack() as stack:
            for table in tables:
                stack.enter_context(mock.patch.object(table, "get", lambda key: None))
                stack.enter_context(mock.patch.object(table, "put", lambda key, replay: None))
            yield
    for batch, seqlen, nheads, head_dim, causal in SHAPES:
        step = peers(batch, seqlen, nheads, head_dim, causal, True)["flashtile"]
        step()
        us = median_us_under(step, {"replayed": contextlib.nullcontext, "launcher": launcher}, rounds, calls)
        on, off = us["replayed"], us["launcher"]
        print(f"| {batch} | {seqlen} | {nheads} | {head_dim} | {causal} | {on:.1f} | {off:.1f} | {on / off:.2f} |",
              flush=True)

if __name__ == "__main__":
    main()
