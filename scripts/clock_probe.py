"""Run each forward back to back for a few seconds while nvidia-smi samples the SM clock and board power, to
tell a kernel that takes more cycles from one that runs at a lower clock (docs/perf/forward.md, v10):

    python scripts/clock_probe.py --seqlen 8192 --head-dim 128 --peers flashtile cuDNN
"""
import argparse
import statistics
import subprocess
import time

import torch

from flashtile.bench.__main__ import HIDDEN, TOKENS, fwd_flops
from flashtile.bench.peers import FORWARD


def sampler():
    return subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "100"], stdout=subprocess.PIPE, text=True)


def readings(smi):
    """[(sm MHz, W)] that ``smi`` sampled, without the first quarter (the ramp)."""
    smi.terminate()
    samples = [tuple(float(x) for x in line.split(",")) for line in smi.communicate()[0].splitlines() if "," in line]
    return samples[len(samples) // 4:]


def sustained(run, inputs, seconds):
    """(ms per call, [(sm MHz, W)]) over ``seconds`` of back-to-back calls, sampled every 100 ms."""
    smi = sampler()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 0
    t0 = time.time()
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            run(*inputs)
        calls += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, readings(smi)


def as_benchmarked(run, inputs, seconds):
    """(do_bench's median ms, the attention kernel's own mean ms from the profiler, [(sm MHz, W)]): do_bench clears
    the L2 before each call, so the GPU also runs a memset between the calls."""
    import triton
    smi = sampler()
    ms = triton.testing.do_bench(lambda: run(*inputs), warmup=100, rep=seconds * 1000, return_mode="median")
    samples = readings(smi)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        triton.testing.do_bench(lambda: run(*inputs), warmup=0, rep=50, return_mode="median")
    top = max(prof.key_averages(), key=lambda e: e.self_device_time_total)  # the attention kernel
    return ms, top.self_device_time_total / top.count / 1e3, samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--peers", nargs="+", default=["flashtile", "cuDNN"], choices=list(FORWARD))
    args = parser.parse_args()
    n, d = args.seqlen, args.head_dim
    b, h = TOKENS // n, HIDDEN // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = fwd_flops(b, h, n, n, d, args.causal)
    print("| peer | timing | ms per call | TFLOP/s | kernel ms (profiler) | SM MHz (median) | W (median) |")
    print("|---|---|---|---|---|---|---|")
    for peer in args.peers * 2:
        prepare, run = FORWARD[peer](args.causal)
        inputs = prepare(q, k, v)
        run(*inputs)
        for timing in ("back to back", "do_bench"):
            if timing == "do_bench":
                ms, own, samples = as_benchmarked(run, inputs, args.seconds)
            else:
                (ms, samples), own = sustained(run, inputs, args.seconds), None
            mhz = statistics.median(s[0] for s in samples)
            watts = statistics.median(s[1] for s in samples)
            print(f"| {peer} | {timing} | {ms:.3f} | {flops / ms / 1e9:.0f} | {f'{own:.3f}' if own else '–'} | "
                  f"{mhz:.0f} | {watts:.0f} |", flush=True)


if __name__ == "__main__":
    main()
