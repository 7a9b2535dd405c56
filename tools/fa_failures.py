"""Summarises a pytest -v -rf run of flash-attn's tests/test_flash_attn.py (stdin, possibly cut short by a timeout):
outcomes per test function, the parameter values common to its failures, and the distinct error messages of the
final summary (numbers blanked)."""
import collections
import re
import sys


def main():
    outcomes, per_function, per_value = collections.Counter(), collections.Counter(), collections.Counter()
    messages, totals = collections.Counter(), []
    for line in sys.stdin:
        line = line.rstrip()
        if line.startswith("FAILED "):
            test, _, message = line[len("FAILED "):].partition(" - ")
            messages[test.split("::")[-1].partition("[")[0], re.sub(r"[-+]?\d[\d.e+-]*", "#", message)[:160]] += 1
            continue
        if re.search(r"\d+ (passed|failed)", line):
            totals.append(line)
        found = re.search(r"(PASSED|FAILED|SKIPPED|ERROR) \S*::(\w+)\[?([^\] ]*)", line)
        if not found:
            continue
        outcome, function, params = found.groups()
        outcomes[function, outcome] += 1
        if outcome in ("FAILED", "ERROR"):
            per_function[function] += 1
            for position, value in enumerate(params.split("-")):
                per_value[function, position, value] += 1
    print(*totals, sep="\n")
    for function in sorted({f for f, _ in outcomes}):
        counts = [f"{n} {o.lower()}" for (f, o), n in sorted(outcomes.items()) if f == function]
        print(f"{function}: {', '.join(counts)}")
    for function, count in per_function.most_common():
        shared = sorted((pos, v) for (f, pos, v), n in per_value.items() if f == function and n == count)
        print("  in every failure: " + ", ".join(f"param {pos}={v}" for pos, v in shared))
        for (f, message), n in messages.most_common():
            if f == function:
                print(f"  {n} × {message}")
    by_value = sorted(((n, f, pos, v) for (f, pos, v), n in per_value.items()), reverse=True)[:30]
    print("most common parameter values among failures:",
          ", ".join(f"{f.removeprefix('test_flash_attn')}[{pos}]={v}:{n}" for n, f, pos, v in by_value))


if __name__ == "__main__":
    main()
