"""Where a flash-attn tests call's time went (tools/flash_attn_conftest.py's FA_TIMES file): the cases' seconds in
all and in Triton's compile, per test function, and the slowest cases apart from compiling.

    python3 tools/fa_times.py fa-times.tsv [--top 10]
"""
import argparse
import collections


def summary(lines, top=10):
    """The report's lines from FA_TIMES lines (case id, seconds, compile seconds; tab-separated)."""
    per_function = collections.defaultdict(lambda: [0, 0.0, 0.0])
    cases = []
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 3:
            continue
        case, seconds, compiling = parts[0], float(parts[1]), float(parts[2])
        function = case.split("::")[-1].partition("[")[0]
        row = per_function[function]
        row[0], row[1], row[2] = row[0] + 1, row[1] + seconds, row[2] + compiling
        cases.append((seconds - compiling, seconds, case))
    total = sum(r[1] for r in per_function.values())
    compiling = sum(r[2] for r in per_function.values())
    out = [f"{len(cases)} cases, {total:.0f} s in all (summed over workers), {compiling:.0f} s compiling "
           f"({100 * compiling / total if total else 0:.0f} %)", "| function | cases | s | compiling s |",
           "|---|---|---|---|"]
    by_seconds = sorted(per_function.items(), key=lambda item: -item[1][1])
    out += [f"| {f} | {n} | {s:.0f} | {c:.0f} |" for f, (n, s, c) in by_seconds]
    out.append(f"slowest {top} apart from compiling (s without compiling, s in all):")
    out += [f"  {rest:.1f} {seconds:.1f} {case}" for rest, seconds, case in sorted(cases, reverse=True)[:top]]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    with open(args.path) as f:
        print("\n".join(summary(f, args.top)))


if __name__ == "__main__":
    main()
