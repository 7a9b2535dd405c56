"""How much the causal backward's uneven programs cost in the launch order alone: list-schedule the grid's
programs (durations in K/V or Q tiles visited, plus a fixed cost) onto the concurrent slots, in launch order
and longest-first, against the perfectly balanced time. ``python scripts/bwd_schedule_sim.py``"""
import heapq


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


if __name__ == "__main__":
    main()
