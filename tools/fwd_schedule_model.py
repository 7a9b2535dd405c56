"""A model of the Hopper forward's persistent grid (docs/perf/forward.md, v29 and v38): which programs get which
work items (a replica of kernels/hopper/fwd_schedule.work_item, in Python) and how long the busiest program runs, in
K/V tiles times the share of the tile's warpgroups that compute; with claims (SCHEDULE 3, lpt_item), each item goes
to the program that becomes free first. Also checks that every order takes each Q tile exactly once.

    python tools/fwd_schedule_model.py
"""
import math

SMS, WG_M, BLOCK_N = 132, 64, 128


def item(pid, grid, w, n_m, n_bh, seqlen_q, block_m, schedule):
    """(head, Q tile) of program pid's w-th item, as _item computes it."""
    rem = seqlen_q % block_m
    ragged = int(0 < rem <= block_m - WG_M)
    if schedule == 2:
        i = pid + w * grid
        n_whole = n_m - ragged
        if i >= n_bh * n_whole:
            return i - n_bh * n_whole, n_m - 1
        return i // n_whole, i % n_whole
    pair, side, n_half = pid + w // 2 * grid, w % 2, (n_m + 1) // 2
    bh, j = pair // n_half, pair % n_half
    if schedule == 1:
        n_light = min(ragged + n_m % 2, n_half)
        n_heavy = n_half - n_light
        bh, j = pair // max(n_heavy, 1), pair % max(n_heavy, 1) + ragged
        if pair >= n_bh * n_heavy:
            bh = (pair - n_bh * n_heavy) // n_light
            j = ((pair - n_bh * n_heavy) % n_light + 1 - ragged) * (n_half - 1)
    return bh, j + (1 - side) * (n_m - 1 - 2 * j) + side * int(2 * j == n_m - 1) * (n_m - j)


def items_of(pid, grid, n_m, n_bh, seqlen_q, block_m, schedule):
    work = n_bh * (n_m if schedule == 2 else (n_m + 1) // 2)
    count = math.ceil((work - pid) / grid) * (1 if schedule == 2 else 2)
    return [item(pid, grid, w, n_m, n_bh, seqlen_q, block_m, schedule) for w in range(count)]


def cost(m, seqlen, block_m, causal):
    """K/V tiles of Q tile m times the share of its warpgroups with rows in the sequence (192-row causal tiles:
    each warpgroup stops at its own last row)."""
    total = 0.0
    for wg in range(block_m // WG_M):
        first = m * block_m + wg * WG_M
        if first < seqlen:
            hi = min(seqlen, (first + WG_M) if block_m > 128 else (m + 1) * block_m) if causal else seqlen
            total += math.ceil(hi / BLOCK_N) / (block_m // WG_M)
    return total


def lpt_item(i, side, n_m, n_bh, tail_heads):
    """(head, Q tile, whether a second tile follows) of side ``side`` of claimed item i, as fwd_schedule.lpt_item
    computes it."""
    n_half = (n_m + 1) // 2
    n_pairs = (n_bh - tail_heads) * n_half
    if i < n_pairs:
        bh, j = divmod(i, n_half)
        return bh, j + (1 - side) * (n_m - 1 - 2 * j), side == 0 and 2 * j != n_m - 1
    t = i - n_pairs
    return n_bh - tail_heads + t % tail_heads, n_m - 1 - t // tail_heads, False


def claimed_items(n_m, n_bh, grid=SMS, rounds=2):
    """The claim order's items, each a list of (head, Q tile), with the launcher's tail_heads for claims=rounds."""
    n_half = (n_m + 1) // 2
    tail_heads = min(n_bh, math.ceil(rounds * grid / n_half))
    items = []
    for i in range((n_bh - tail_heads) * n_half + tail_heads * n_m):
        bh, m, two = lpt_item(i, 0, n_m, n_bh, tail_heads)
        items.append([(bh, m)] + ([lpt_item(i, 1, n_m, n_bh, tail_heads)[:2]] if two else []))
    return items


def busiest_claims(seqlen, n_bh, block_m, causal, grid=SMS, rounds=2):
    """The busiest program's work when each claimed item goes to the program that is free first."""
    n_m = math.ceil(seqlen / block_m)
    items = claimed_items(n_m, n_bh, grid, rounds)
    loads = [0.0] * min(grid, len(items))
    for item in items:
        p = loads.index(min(loads))
        loads[p] += sum(cost(m, seqlen, block_m, causal) for _, m in item)
    return max(loads)


def busiest(seqlen, n_bh, block_m, causal, schedule, grid=SMS):
    n_m = math.ceil(seqlen / block_m)
    work = n_bh * (n_m if schedule == 2 else (n_m + 1) // 2)
    grid = min(grid, work)
    return max(sum(cost(m, seqlen, block_m, causal) for _, m in items_of(p, grid, n_m, n_bh, seqlen, block_m,
                                                                          schedule) if m < n_m)
               for p in range(grid))


def check_bijection():
    for block_m in (128, 192):
        for seqlen in list(range(1, 1300, 7)) + [2048, 4096]:
            n_m = math.ceil(seqlen / block_m)
            for n_bh in (1, 2, 5, 64):
                for grid in (1, 7, 132):
                    for schedule in (0, 1, 2):
                        work = n_bh * (n_m if schedule == 2 else (n_m + 1) // 2)
                        taken = [t for p in range(min(grid, work))
                                 for t in items_of(p, min(grid, work), n_m, n_bh, seqlen, block_m, schedule)
                                 if t[1] < n_m]
                        assert sorted(taken) == [(b, m) for b in range(n_bh) for m in range(n_m)], (
                            block_m, seqlen, n_bh, grid, schedule)
                    for rounds in (1, 2, 3):
                        claimed = [t for item in claimed_items(n_m, n_bh, grid, rounds) for t in item]
                        assert sorted(claimed) == [(b, m) for b in range(n_bh) for m in range(n_m)], (
                            block_m, seqlen, n_bh, grid, rounds)


if __name__ == "__main__":
    check_bijection()
    print("| D | mask | N | busiest program, head-major pairs | balanced | gain | claims (causal) | gain |")
    print("|---|---|---|---|---|---|---|---|")
    for d, causal, block_m in ((64, False, 192), (64, True, 128), (64, True, 192), (128, False, 128),
                               (128, True, 128)):
        for n in (1024, 2048, 4096, 8192, 16384):
            n_bh = (16384 // n) * (2048 // d)
            old = busiest(n, n_bh, block_m, causal, 0)
            new = busiest(n, n_bh, block_m, causal, 1 if causal else 2)
            row = f"| {d} | {'causal' if causal else 'full'} | {n} | {old:.1f} | {new:.1f} | {old / new - 1:+.1%} |"
            if causal:
                claims = busiest_claims(n, n_bh, block_m, causal)
                row += f" {claims:.1f} | {new / claims - 1:+.1%} |"
            print(row)
