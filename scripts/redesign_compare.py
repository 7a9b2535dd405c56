"""Issue 38's speed bar: flashtile before and after the redesign, cell by cell, from two runs of the benchmarks
(``python -m flashtile.bench --backward --peers flashtile`` and ``python -m flashtile.bench.decode``) written to
BEFORE/ and AFTER/ (bench.json, decode.json); a side given as several folders (comma-separated: processes taking
turns with the other side's, ABBAAB) takes each cell's median over them, so that neither a drift of the GPU's speed
over the call nor one process that runs a cell slow (docs/perf/backward.md, "The bar's noise") decides a cell. Prints
each cell's speed after over before (forward, backward, forward + backward; decode eager) and the spread of its
processes, then the lowest and the median ratio against the bar (no cell under 0.95, the median at 0.99 or more),
and the same verdict on geometric means over the processes instead of medians (the bar's verdict with ``--bar``; any
other pair of trees, gpu_session.sh tree-ab, gets the numbers alone).

    python scripts/redesign_compare.py [--bar] BEFORE[,BEFORE2,...] AFTER[,AFTER2,...]
"""
import argparse
import json
import statistics
from pathlib import Path

FORWARD_KEY = ("batch", "seqlen", "nheads", "head_dim", "causal")
TIMES = (("forward", "ms"), ("backward", "bwd_ms"), ("forward + backward", "fwdbwd_ms"))


def cells(folder):
    """{(pass, cell): time} of flashtile's rows in ``folder``'s bench.json and decode.json (those present)."""
    out = {}
    bench, decode = Path(folder, "bench.json"), Path(folder, "decode.json")
    if bench.exists():
        for row in json.loads(bench.read_text())["forward"]:
            if row["peer"] == "flashtile":
                cell = tuple(row[k] for k in FORWARD_KEY)
                out.update({(name, cell): row[key] for name, key in TIMES if row.get(key)})
    if decode.exists():
        for row in json.loads(decode.read_text()):
            if row["peer"] == "flashtile" and row.get("us"):
                out[("decode", (row["layout"], row["batch"], row["seqlen"]))] = row["us"]
    return out


def process_times(folders):
    """{(pass, cell): [time in each comma-separated folder that has it]}."""
    times = {}
    for folder in folders.split(","):
        for key, time in cells(folder).items():
            times.setdefault(key, []).append(time)
    return times


def spread(values):
    """The slowest process's time over the fastest's."""
    return max(values) / min(values)


def compare(before, after):
    """[(pass, cell, speed after / before)] for the cells both runs have."""
    return [(name, cell, before[(name, cell)] / after[(name, cell)]) for name, cell in before if (name, cell) in after]


def verdict(ratios, estimator, bar):
    values = [r for _, _, r in ratios]
    low, mid = min(values), statistics.median(values)
    line = f"{len(values)} cells, {estimator} over processes: lowest {low:.3f}, median {mid:.3f}"
    if bar:
        line += f"; the bar (lowest ≥ 0.95, median ≥ 0.99) is {'met' if low >= 0.95 and mid >= 0.99 else 'missed'}"
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bar", action="store_true", help="issue 38's verdict after the numbers")
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args()
    before, after = process_times(args.before), process_times(args.after)
    ratios = compare(*({k: statistics.median(v) for k, v in side.items()} for side in (before, after)))
    if not ratios:
        raise SystemExit("no cell in both runs")
    print("| pass | cell | after / before (speed) | spread before | spread after |\n|---|---|---|---|---|")
    for name, cell, ratio in ratios:
        print(f"| {name} | {', '.join(map(str, cell))} | {ratio:.3f} | {spread(before[(name, cell)]):.3f} | "
              f"{spread(after[(name, cell)]):.3f} |")
    print("\n" + verdict(ratios, "medians", args.bar))
    print(verdict(compare(*({k: statistics.geometric_mean(v) for k, v in side.items()} for side in (before, after))),
                  "geometric means", args.bar))


if __name__ == "__main__":
    main()
