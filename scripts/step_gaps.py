"""Where the GPU waits inside an eager training step (issue 36 item 3): forward + backward through autograd, each
peer as flashtile.bench calls it, steps back to back as do_bench runs them (the L2 cleared between steps), under the
profiler; per step, the kernels' time, the idle time between them, and which kernel each idle stretch came before;
after a second idle, after two seconds of steps, and do_bench's time of a step beside them (the clocks' share).
Run on the GPU: ``PYTHONPATH=. python scripts/step_gaps.py [--seqlens 1024 4096] [--head-dims 64 128] [--causal 1]``."""
import argparse
import collections
import time

import torch
import triton

from flashtile.bench.__main__ import peer_step
from flashtile.bench.peers import FORWARD

STEPS = 20


def clocks():
    """The SM clock (MHz) and power (W) now, where pynvml is there."""
    try:
        return f"{torch.cuda.clock_rate()} MHz {torch.cuda.power_draw() / 1000:.0f} W"
    except Exception:  # pynvml missing
        return "?"


def gaps(step):
    """Per step: kernel µs, idle µs, and the idle µs before each kernel name. Between steps the L2 is overwritten
    (bitwise_not of 256 MB, do_bench's clear); its time and the wait before it are outside the step, as in do_bench,
    and the wait after it, before the step's first kernel, inside."""
    cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            cache.bitwise_not_()
            step()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    busy, idle, before = 0.0, 0.0, collections.defaultdict(float)
    for prev, e in zip(events, events[1:]):
        if "bitwise_not" in e.name:
            continue
        wait = max(0.0, e.time_range.start - prev.time_range.end)
        idle += wait
        before[e.name[:60]] += wait
        busy += e.device_time
    return busy / STEPS, idle / STEPS, {k: v / STEPS for k, v in before.items()}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", type=int, nargs="+", default=[1])
    args = parser.parse_args(argv)
    print("| peer | D | causal | N | when | kernels µs a step | idle µs a step | idle before (µs a step) "
          "| clock, power after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.head_dims:
        for causal in map(bool, args.causal):
            for n in args.seqlens:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for name in ("flashtile", "FA4", "cuDNN"):
                    try:
                        step = peer_step(FORWARD[name], causal, q, k, v, True)
                    except ImportError:  # FA4 not installed
                        continue
                    for when in ("after 1 s idle", "after 2 s of steps", "do_bench"):
                        if when == "do_bench":
                            ms = triton.testing.do_bench(step, warmup=25, rep=100)
                            print(f"| {name} | {d} | {'yes' if causal else 'no'} | {n} | {when} | {ms * 1000:.0f} "
                                  f"(step) | | | {clocks()} |", flush=True)
                            continue
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        while when == "after 1 s idle" and time.perf_counter() - start < 1:
                            time.sleep(0.05)
                        while when == "after 2 s of steps" and time.perf_counter() - start < 2:
                            step()
                        busy, idle, before = gaps(step)
                        where = ", ".join(f"{k} {w:.0f}" for k, w in sorted(before.items(), key=lambda x: -x[1])
                                          if w >= 1)
                        print(f"| {name} | {d} | {'yes' if causal else 'no'} | {n} | {when} | {busy:.0f} | {idle:.0f} "
                              f"| {where} | {clocks()} |", flush=True)


if __name__ == "__main__":
    main()
