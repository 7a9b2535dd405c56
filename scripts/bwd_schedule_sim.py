"""How much the causal backward's uneven programs cost in the launch order alone: list-schedule the grid's
programs (durations in K/V or Q tiles visited, plus a fixed cost) onto the concurrent slots, in launch order
and longest-first, against the perfectly balanced time. ``python scripts/bwd_schedule_sim.py``; ``--one-pass``:
today's sm90 one pass (one program an SM) in launch order against groups of KV heads taking turns, the groups sized
as docs/results/bwd-swizzle-run58.patch sizes them (its prediction)."""
import heapq
import sys


def makespan(durations, slots):
    free = [0.0] * slots
    end = 0.0
    for d in durations:
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main(tiles=256, heads=16, fixed=3):
    """Defaults: N=16k in 64-row tiles, B·H = 16 (the D=128 bench shape)."""
    per_head = [tiles - i + fixed for i in range(tiles)] + [m + 1 + fixed for m in reversed(range(tiles))]
    launch = [d for _ in range(heads) for d in per_head]  # heads slowest, heavy tiles first, as launched
    for slots in (132, 264, 396):
        ideal = sum(launch) / slots
        print(f"{slots} concurrent programs: launch order {makespan(launch, slots) / ideal:.3f}, "
              f"longest first {makespan(sorted(launch, reverse=True), slots) / ideal:.3f} of the balanced time")


def l2_group(seqlen, head_dim, heads, budget=32 << 20):
    """KV heads whose Q, dO (bf16) and float32 dQ rows fit ``budget`` bytes together, a power of two up to ``heads``."""
    group = 1
    while group * 2 <= heads and group * 2 * seqlen * head_dim * 8 <= budget:
        group *= 2
    return group


def one_pass():
    """B·N = 16k, H·D = 2048, causal; µs a step and a program from scripts/bwd_fixed_cost.py's D=64 line and run 53's
    D=128 phases (docs/perf/backward.md)."""
    for head_dim, step, fixed, rows in ((64, 2.4, 4.9, 128), (128, 2.1, 4.0, 64)):
        heads = 2048 // head_dim
        for n in (1024, 2048, 4096, 8192, 16384):
            per_head = [(n - 128 * j) // rows * step + fixed for j in range(n // 128)]  # K/V tile j, heavy first
            launch = per_head * (16384 // n * heads)
            group, turns = l2_group(n, head_dim, heads), []
            for _ in range(16384 // n):
                for first in range(0, heads, group):
                    turns += [d for d in per_head for _ in range(min(group, heads - first))]
            ideal = sum(launch) / 132
            a, b = makespan(launch, 132) / ideal, makespan(turns, 132) / ideal
            print(f"D={head_dim} N={n} group {group}: launch order {a:.3f}, heads taking turns {b:.3f} "
                  f"of the balanced time ({a / b - 1:+.1%})")


if __name__ == "__main__":
    one_pass() if "--one-pass" in sys.argv else main()
