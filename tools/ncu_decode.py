"""One decode step of flashtile and of SDPA's cuDNN inside a profiler window, for Nsight Compute on the
device (docs/perf/decode.md, v10), and a table of what the report says about each kernel:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \
        --section MemoryWorkloadAnalysis --section Occupancy -o dec python tools/ncu_decode.py --batch 32
    ncu --import dec.ncu-rep --page details --csv > dec.csv
    python tools/ncu_decode.py --summarize dec.csv
"""
import argparse
import csv

METRICS = ("Duration", "DRAM Throughput", "Grid Size", "Block Size", "Registers Per Thread",
           "Dynamic Shared Memory Per Block", "SM Frequency")


def summarize(paths):
    """A markdown row per kernel of each ncu details CSV: the first value ncu gives for each of METRICS."""
    print("| report | kernel | " + " | ".join(METRICS) + " |")
    print("|---" * (len(METRICS) + 2) + "|")
    for path in paths:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        kernels = {}
        for row in rows:
            kernels.setdefault(row["Kernel Name"], {}).setdefault(row["Metric Name"],
                                                                  f"{row['Metric Value']} {row['Metric Unit']}")
        for name, metrics in kernels.items():
            cells = [metrics.get(m, "–").strip() for m in METRICS]
            print(f"| {path} | {name.split('(')[0][:60]} | " + " | ".join(cells) + " |")


def profile(batch, seqlen, names):
    import torch

    from flashtile.bench.decode import peers
    fns = peers(batch, seqlen)
    for name in names:
        for _ in range(3):  # compile and warm up outside the window
            fns[name]()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name in names:
        fns[name]()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=32768)
    parser.add_argument("--peers", nargs="+", default=["flashtile", "cuDNN"])
    parser.add_argument("--summarize", nargs="+", metavar="CSV", help="only print the table of these reports")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    profile(args.batch, args.seqlen, args.peers)


if __name__ == "__main__":
    main()
