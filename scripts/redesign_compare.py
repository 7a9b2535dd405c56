"""Issue 38's speed bar: flashtile before and after the redesign, cell by cell, from two runs of the benchmarks
(``python -m flashtile.bench --backward --peers flashtile`` and ``python -m flashtile.bench.decode``) written to
BEFORE/ and AFTER/ (bench.json, decode.json); a side given as several folders (comma-separated: runs taking turns with
the other side's, in ABBA order) takes each cell's geometric mean over them, so that a drift of the GPU's speed over
the call weighs on both sides alike. Prints each cell's speed after over before (forward, backward,
forward + backward; decode eager), then the lowest and the median ratio against the bar (no cell under 0.95, the
median at 0.99 or more).

    python scripts/redesign_compare.py BEFORE[,BEFORE2] AFTER[,AFTER2]
"""
import json
import statistics
import sys
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


def mean_cells(folders):
    """cells() of each comma-separated folder, each cell's geometric mean over the folders that have it."""
    times = {}
    for folder in folders.split(","):
        for key, time in cells(folder).items():
            times.setdefault(key, []).append(time)
    return {key: statistics.geometric_mean(values) for key, values in times.items()}


def compare(before, after):
    """[(pass, cell, speed after / before)] for the cells both runs have."""
    return [(name, cell, before[(name, cell)] / after[(name, cell)]) for name, cell in before if (name, cell) in after]


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    ratios = compare(mean_cells(sys.argv[1]), mean_cells(sys.argv[2]))
    if not ratios:
        raise SystemExit("no cell in both runs")
    print("| pass | cell | after / before (speed) |\n|---|---|---|")
    for name, cell, ratio in ratios:
        print(f"| {name} | {', '.join(map(str, cell))} | {ratio:.3f} |")
    values = [r for _, _, r in ratios]
    low, mid = min(values), statistics.median(values)
    print(f"\n{len(values)} cells: lowest {low:.3f}, median {mid:.3f}; the bar (lowest ≥ 0.95, median ≥ 0.99) is "
          f"{'met' if low >= 0.95 and mid >= 0.99 else 'missed'}")


if __name__ == "__main__":
    main()
