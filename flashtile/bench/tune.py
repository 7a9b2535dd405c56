"""``python -m flashtile.bench.tune [--backward | --hopper] [--peers cuDNN ...]``: sweep tile configs on the
bench grid, forward peers timed in the same turns; the winners go into flashtile/configs.py by hand, the
printed table into docs/results/."""
import argparse
import itertools

import torch

from .. import checks, ops
from ..configs import FWD_SM90, BwdConfig, HopperFwdConfig, TileConfig, from_fields
from . import require_gpu
from .__main__ import HIDDEN, TOKENS, bench_ms, best_of_turns, error_text, fwd_flops, progress, time_peer
from .peers import FORWARD

FWD_CANDIDATES = [from_fields(TileConfig, c) for c in [
    (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
    (128, 128, 4, 2), (128, 128, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3)]]

# (K/V-tile programs: Q tile iterated, K/V tile owned; Q-tile programs: Q tile owned, K/V tile iterated;
# warps, stages; how dQ is summed: "none" = Q-tile programs in the same launch, no atomics).
BWD_CANDIDATES = [from_fields(BwdConfig, c) for c in [
    (64, 64, 64, 64, 4, 3, "tma"), (64, 64, 64, 64, 4, 3, "none"), (64, 64, 64, 64, 4, 2, "none"),
    (64, 64, 64, 64, 4, 4, "none"), (32, 64, 64, 32, 4, 3, "none"), (32, 64, 64, 64, 4, 3, "none"),
    (64, 128, 128, 64, 8, 3, "none"), (64, 64, 128, 64, 8, 3, "none"), (128, 128, 128, 128, 8, 2, "none"),
    (32, 128, 128, 64, 8, 3, "none"),
    # 16- and 32-row Q tiles under the K/V tile, fewer stages: fewer registers spilled at D=128 (ptxas -v)
    (16, 64, 64, 64, 4, 3, "none"), (16, 64, 64, 64, 4, 4, "none"), (32, 64, 64, 64, 4, 2, "none"),
    (16, 64, 64, 32, 4, 3, "none"), (16, 64, 128, 64, 8, 3, "none")]]


# The Hopper forward's ablation: each row changes one thing from the one before (docs/perf/forward.md).
HOPPER_CANDIDATES = [from_fields(HopperFwdConfig, c) for c in [
    (128, 128, 2, 168, 168, True),  # no register reallocation: consumers keep the entry cap (ptxas spills)
    (128, 64, 2, 240, 168, False),  # 64-key tiles, warpgroups issue their products whenever ready
    (128, 128, 2, 240, 168, False),  # 128-key tiles
    (128, 128, 2, 240, 168, True),  # ping-pong: the warpgroups take turns at the tensor cores
    (128, 128, 3, 240, 168, True),  # a third K/V stage
    (128, 64, 3, 240, 168, True),
    (128, 128, 4, 240, 168, True),  # a fourth (D=64 only)
    (128, 128, 3, 240, 168, True, True),
    (128, 128, 2, 240, 168, True, True),
    (128, 128, 3, 240, 168, True, False, True),  # persistent: one program per SM walks the work items
    (128, 128, 3, 240, 168, True, True, True),
    (128, 64, 2, 240, 168, True, False, False),  # D=256's tiles
    (128, 64, 2, 240, 168, True, False, True),
    (128, 128, 4, 240, 168, True, False, True),  # the softmax under the previous tile's P·V
    # 192 Q rows, a third consumer warpgroup (D=64: 16 warps leave 160 registers to each consumer)
    (192, 128, 2, 160, 128, True, False, True),
    (192, 128, 3, 160, 128, True, False, True),
    (192, 128, 4, 160, 128, True, False, True),
    (192, 128, 3, 160, 128, True, False, False)]]


def _label(cfg):
    if isinstance(cfg, HopperFwdConfig):
        return (f"{cfg.block_m},{cfg.block_n} x{cfg.num_stages} regs {cfg.consumer_regs}"
                f"{' ping-pong' if cfg.pingpong else ''}{' overlap-pv' if cfg.overlap_pv else ''}"
                f"{' persistent' if cfg.persistent else ''}")
    if isinstance(cfg, BwdConfig):
        return (f"{cfg.block_m1},{cfg.block_n1} / {cfg.block_m2},{cfg.block_n2}, {cfg.num_warps},{cfg.num_stages} "
                f"{cfg.dq_atomic}")
    return f"{cfg.block_m},{cfg.block_n},{cfg.num_warps},{cfg.num_stages}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.tune")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--backward", action="store_true", help="sweep the backward")
    parser.add_argument("--hopper", action="store_true", help="sweep the warp-specialized sm90 forward")
    parser.add_argument("--pick", type=int, nargs="+", help="only these candidates (indices into the list)")
    parser.add_argument("--peers", nargs="*", default=[], choices=list(FORWARD),
                        help="forward peers timed in the same turns as the candidates (a row each)")
    parser.add_argument("--rounds", type=int, default=1, help="turns each candidate and peer takes; best kept")
    args = parser.parse_args(argv)
    if args.backward and args.peers:
        parser.error("--peers times forward peers; the backward sweep has none")
    require_gpu("python -m flashtile.bench.tune")
    candidates = BWD_CANDIDATES if args.backward else HOPPER_CANDIDATES if args.hopper else FWD_CANDIDATES
    if args.pick:
        candidates = [candidates[i] for i in args.pick]
    results = {}
    for d, causal, n in progress(list(itertools.product(args.head_dims, [False, True], args.seqlens)), "tile sweep"):
        b, h = TOKENS // n, HIDDEN // d
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        window = checks.window((-1, -1), causal)
        flops = fwd_flops(b, h, n, n, d, causal) * (2.5 if args.backward else 1)
        timers = {cfg: _candidate_timer(cfg, args, q, k, v, dout, window, causal) for cfg in candidates}
        timers.update({peer: lambda peer=peer: time_peer(FORWARD[peer], causal, q, k, v, 10, 40)
                       for peer in args.peers})
        for key, (ms, error) in best_of_turns(timers, args.rounds).items():
            results[(d, causal, n, key)] = flops / ms / 1e9 if ms else None
            if error:
                print(f"skip {key if isinstance(key, str) else _label(key)} d{d}: {error}")
    label = ("K/V tile / Q tile, warps,stages dQ" if args.backward else "BM,BN x stages, consumer regs" if args.hopper
             else "BM,BN,warps,stages")
    print(f"| D | causal | {label} | "
          + " | ".join(f"N={n}" for n in args.seqlens) + " | mean |")
    print("|---" * (len(args.seqlens) + 4) + "|")
    for d, causal in itertools.product(args.head_dims, [False, True]):
        scored = []
        for key in candidates + args.peers:
            vals = [results[(d, causal, n, key)] for n in args.seqlens]
            mean = sum(vals) / len(vals) if all(vals) else 0.0
            scored.append((mean, key if isinstance(key, str) else _label(key), vals))
        for mean, name, vals in sorted(scored, key=lambda s: s[0], reverse=True):
            cells = " | ".join(f"{x:.0f}" if x else "–" for x in vals)
            print(f"| {d} | {'yes' if causal else 'no'} | {name} | {cells} | {mean:.0f} |")


def _candidate_timer(cfg, args, q, k, v, dout, window, causal):
    """() -> (median ms or None, error or None) of one tile config on these inputs."""
    d = q.shape[-1]
    scale = d ** -0.5
    checked = [not args.hopper]  # the comparison with the portable kernel runs in the first turn only

    def timer():
        try:
            if args.backward:
                out, lse = ops.attention_forward(q, k, v, scale, window, True)
                deterministic = cfg.dq_atomic == "none"
                return bench_ms(lambda: ops.attention_backward(dout, q, k, v, out, lse, scale, window, True,
                                                               deterministic, config=cfg), 10, 40), None
            if not checked[0]:  # a fast wrong kernel must not win: compare with the portable kernel first
                out, _ = ops.attention_forward(q, k, v, scale, window, True, config=cfg)
                ref, _ = ops.attention_forward(q, k, v, scale, window, True, config=FWD_SM90[(d, causal)])
                if not (out.float() - ref.float()).abs().max().item() < 2e-2:
                    raise ValueError("output differs from the portable kernel")
                checked[0] = True
            return bench_ms(lambda: ops.attention_forward(q, k, v, scale, window, True, config=cfg), 10, 40), None
        except Exception as err:  # a config that does not fit (shared memory, registers) is skipped
            return None, error_text(err, 100)
    return timer


if __name__ == "__main__":
    main()
