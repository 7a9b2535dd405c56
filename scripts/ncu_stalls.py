"""Summarize the per-instruction (SASS) page of an Nsight Compute report: where each kernel's warps were
sampled stalled, and on what, its executed instruction mix, and the instructions with the most samples.

    ncu --import fwd.ncu-rep --page source --csv --print-source sass > fwd-sass.csv
    python scripts/ncu_stalls.py fwd-sass.csv 25
"""
import collections
import csv
import sys

SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernels(path):
    """{kernel name: [row of one SASS instruction]} of the CSV that ncu's source page writes."""
    found, header, name = collections.defaultdict(list), None, None
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            name = row[1]
        elif row and row[0] == "Address":
            header = row
        elif header and len(row) >= len(header) - 1:
            found[name].append(dict(zip(header, row)))
    return found


def opcode(source):
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def stalls(row):
    return {k[len("stall_"):]: number(v) for k, v in row.items() if k.startswith("stall_") and "Not Issued" not in k}


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    for name, rows in kernels(path).items():
        total = sum(number(r[SAMPLES]) for r in rows)
        executed = sum(number(r[EXECUTED]) for r in rows)
        print(f"== {name[:90]}: {total:.0f} samples, {executed / 1e6:.1f}M warp instructions, {len(rows)} in SASS")
        reasons = collections.Counter()
        by_op, samples_by_op = collections.Counter(), collections.Counter()
        for r in rows:
            reasons.update(stalls(r))
            by_op[opcode(r["Source"])] += number(r[EXECUTED])
            samples_by_op[opcode(r["Source"])] += number(r[SAMPLES])
        print("  stalled on: " + ", ".join(f"{k} {v / total:.1%}" for k, v in reasons.most_common(10)))
        print("  executed: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in by_op.most_common(18)))
        print("  samples: " + ", ".join(f"{k} {v / total:.1%}" for k, v in samples_by_op.most_common(14)))
        for r in sorted(rows, key=lambda r: -number(r[SAMPLES]))[:top]:
            main_reasons = sorted(((v, k) for k, v in stalls(r).items()), reverse=True)[:2]
            print(f"  {number(r[SAMPLES]) / total:6.1%}  executed {number(r[EXECUTED]) / 1e3:7.0f}k  "
                  f"{r['Source'][:64]:64} " + ", ".join(f"{k} {v:.0f}" for v, k in main_reasons))


if __name__ == "__main__":
    main()
