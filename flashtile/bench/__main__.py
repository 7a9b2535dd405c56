"""``python -m flashtile.bench``: flashtile's forward against the peers, all in one process and run.

Grid as in the FlashAttention papers and ../shared/anchors/H200.md: B·N = 16k tokens, H·D = 2048,
N 512–16k, D 64 and 128, causal on and off, bf16. Writes a table (stdout and markdown), a JSON file,
a PNG of TFLOP/s against N, and a memory sweep (B=1, H=16, D=128, N up to 128k) against naive attention.
"""
import argparse
import functools
import json
import os
import sys
import time

import torch

from . import inputs, require_gpu
from .peers import DEFAULT_PEERS, FORWARD, setting

TOKENS, HIDDEN = 16384, 2048


def progress(items, desc):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=desc, file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        return items


def fwd_flops(batch, nheads, seqlen_q, seqlen_k, head_dim, causal):
    """The forward's FLOPs: half the full count where causal; with a sliding window (left, right), bottom-right aligned,
    those of the (query, key) pairs it leaves."""
    if isinstance(causal, (tuple, list)):
        left, right = causal
        diagonal = torch.arange(seqlen_q, dtype=torch.int64) + seqlen_k - seqlen_q  # [seqlen_q] each row's own key
        lo = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
        hi = (diagonal + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(diagonal, seqlen_k - 1)
        pairs = int((hi - lo + 1).clamp(min=0).sum())
        return 4 * batch * nheads * pairs * head_dim
    flops = 4 * batch * nheads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def mask_name(causal):
    """A bench mask as the tables print it: yes, no, or the window (left, right)."""
    if isinstance(causal, (tuple, list)):
        return f"window ({causal[0]}, {causal[1]})"
    return "yes" if causal else "no"


def bench_ms(fn, warmup=25, rep=100):
    import triton
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def error_text(err, width=120):
    """One line naming an exception, for a table cell or a log."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:width]}"


def is_oom(err):
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def peer_step(make, causal, q, k, v, backward=False):
    """One eager call of a peer on q, k, v: its forward, or its forward + backward through autograd."""
    prepare, run = make(causal)
    args = prepare(q, k, v)
    if not backward:
        return lambda: run(*args)
    args = tuple(t.requires_grad_() for t in args)
    dout = torch.randn_like(run(*args))
    return lambda: torch.autograd.grad(run(*args), args, dout)


def time_peer(make, causal, q, k, v, warmup, rep, backward=False):
    """Median ms of one peer's forward (or forward + backward), or the reason it could not run."""
    try:
        step = peer_step(make, causal, q, k, v, backward)
        step()
        torch.cuda.synchronize()
        return bench_ms(step, warmup, rep), None
    except Exception as err:  # a peer that cannot run this shape is reported, not fatal
        torch.cuda.synchronize()
        return None, "OOM" if is_oom(err) else error_text(err)
    finally:
        torch.cuda.empty_cache()


def host_ms(step, sync, calls=20, warmup=1):
    """Ms of host time per call of ``calls`` back-to-back calls after ``warmup`` unmeasured ones (the GPU synchronized
    before, not in between): what the host needs to issue one call. Where it nears the timed call's length, the GPU
    waits on the host. (``sync`` a no-op: the Python alone.)"""
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    issued = (time.perf_counter() - start) / calls * 1e3
    sync()
    return issued


def host_of_steps(make, causal, q, k, v):
    """host_ms of a peer's forward + backward, or None where it cannot run."""
    try:
        return host_ms(peer_step(make, causal, q, k, v, backward=True), torch.cuda.synchronize)
    except Exception:  # (time_peer has reported why)
        torch.cuda.synchronize()
        return None
    finally:
        torch.cuda.empty_cache()


def every_turn(timers, rounds):
    """{key: [(time, error) of each turn]} of timers {key: () -> (time or None, error or None)}, each called in turn,
    ``rounds`` times over, each round starting one key later, so that a clock dip or a busy host during one turn, or
    the power state the previous key left, does not decide a comparison."""
    keys = list(timers)
    results = {key: [] for key in keys}
    for turn in range(rounds):
        for key in keys[turn % len(keys):] + keys[:turn % len(keys)]:
            results[key].append(timers[key]())
    return results


def best_of_turns(timers, rounds):
    """{key: (lowest time, error)} over ``every_turn``; a key that never ran keeps its last error."""
    best = {}
    for key, results in every_turn(timers, rounds).items():
        times = [t for t, _ in results if t is not None]
        best[key] = (min(times), None) if times else results[-1]
    return best


def warm_gpu(seconds):
    """Bf16 matrix products for ``seconds``: a GPU that starts idle runs its first kernels at a clock it cannot hold
    under load, which favours whichever peer runs first (docs/perf/forward.md)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def grid(seqlens, head_dims, causals, inputs=("random", ), gqa=False):
    """The shapes: B·N = 16k, H·D = 2048 over ``seqlens`` × ``head_dims`` × ``causals`` × ``inputs`` (bench/inputs.py);
    with ``gqa`` also B=2, N=8k, 32 query heads over 8 KV heads, D=128."""
    for kind in inputs:
        for head_dim in head_dims:
            for causal in causals:
                for seqlen in seqlens:
                    yield dict(batch=max(1, TOKENS // seqlen), seqlen=seqlen, nheads=HIDDEN // head_dim,
                               nheads_k=HIDDEN // head_dim, head_dim=head_dim, causal=causal, inputs=kind)
        if gqa:
            for causal in causals:
                yield dict(batch=2, seqlen=8192, nheads=32, nheads_k=8, head_dim=128, causal=causal, inputs=kind)


def run_grid(shapes, peers, warmup, rep, rounds, backward):
    """Every peer on every shape; the peers take turns ``rounds`` times per shape and each keeps its best
    median, so a clock dip during one peer's turn does not decide the comparison. With ``backward`` each
    row also has the backward, timed as (forward + backward) - forward, at 2.5x the forward's FLOPs, and the host time
    of a forward + backward (host_ms: where it nears the timed step, that peer's step waited on the host)."""
    rows = []
    for shape in progress(shapes, "forward grid"):
        b, n, h, d, causal = shape["batch"], shape["seqlen"], shape["nheads"], shape["head_dim"], shape["causal"]
        q, k, v = inputs.make(shape["inputs"], b, n, h, d, nheads_k=shape["nheads_k"])
        flops = fwd_flops(b, h, n, n, d, causal)
        modes = ("fwd", "fwdbwd") if backward else ("fwd",)
        best = best_of_turns({(peer, mode): functools.partial(time_peer, FORWARD[peer], causal, q, k, v, warmup, rep,
                                                              mode == "fwdbwd")
                              for peer in peers for mode in modes}, rounds)
        for peer in peers:
            ms, error = best[(peer, "fwd")]
            row = dict(shape, peer=peer, ms=ms, tflops=flops / ms / 1e9 if ms else None, error=error)
            if backward:
                total, bwd_error = best[(peer, "fwdbwd")]
                bwd_ms = total - ms if total and ms else None
                host = host_of_steps(FORWARD[peer], causal, q, k, v) if total else None
                row.update(fwdbwd_ms=total, bwd_ms=bwd_ms, bwd_tflops=2.5 * flops / bwd_ms / 1e9 if bwd_ms else None,
                           fwdbwd_tflops=3.5 * flops / total / 1e9 if total else None, bwd_error=bwd_error,
                           fwdbwd_host_ms=host)
            rows.append(row)
        del q, k, v
    return rows


def memory_sweep(seqlens, peers=("flashtile", "naive"), nheads=16, head_dim=128, backward=False):
    """Peak memory beyond the inputs, causal, B=1; forward only or forward + backward."""
    rows = []
    for n in progress(seqlens, "memory sweep"):
        for peer in peers:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            try:
                q, k, v = (torch.randn(1, n, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                base = torch.cuda.memory_allocated()
                ms, error = time_peer(FORWARD[peer], True, q, k, v, warmup=1, rep=3, backward=backward)
                peak = torch.cuda.max_memory_allocated() - base
                del q, k, v
            except Exception as err:
                ms, peak, error = None, None, "OOM" if is_oom(err) else type(err).__name__
            peak_gib = peak / 2**30 if peak is not None and not error else None
            rows.append(dict(seqlen=n, peer=peer, backward=backward, ms=ms, peak_gib=peak_gib, error=error))
    return rows


def _shape_key(r):
    return (r["head_dim"], r["causal"], r["seqlen"], r["batch"], r["nheads"], r.get("nheads_k") or r["nheads"],
            r.get("inputs", "random"))


def table(rows, peers, key="tflops", error_key="error"):
    """Markdown: one line per shape (and input distribution), TFLOP/s per peer, flashtile over the best other library
    computing the same thing (its own variants, "flashtile (...)", are not peers): the setting (peers.setting) of the
    first peer listed, so capped flashtile meets capped FA4."""
    compared = setting(peers[0]) if peers else ""
    ours_peer = f"flashtile ({compared})" if compared else "flashtile"
    lines = ["| D | causal | N | B×H | inputs | " + " | ".join(peers) + " | ours / best peer |",
             "|---" * (len(peers) + 6) + "|"]
    for shape in sorted({_shape_key(r) for r in rows}):
        d, causal, n, b, h, h_k, inputs = shape
        cells = {r["peer"]: r for r in rows if _shape_key(r) == shape}
        shown = [f"{cells[p][key]:.0f}" if cells.get(p, {}).get(key) else
                 (cells.get(p, {}).get(error_key) or "–")[:12] for p in peers]
        others = [cells[p][key] for p in peers if not p.startswith("flashtile") and setting(p) == compared
                  and cells.get(p, {}).get(key)]
        ours = cells.get(ours_peer, {}).get(key)
        ratio = f"{ours / max(others):.2f}" if ours and others else "–"
        heads = f"{b}×{h}" if h_k == h else f"{b}×{h}/{h_k}"
        lines.append(f"| {d} | {mask_name(causal)} | {n} | {heads} | {inputs} | " + " | ".join(shown)
                     + f" | {ratio} |")
    return "\n".join(lines)


def host_bound(rows, share=0.9):
    """Markdown lines naming each (peer, shape) whose forward + backward took the host at least ``share`` of the timed
    step: there the GPU waited on the host, and the cell measures the host's speed as much as the kernels'."""
    lines = []
    for r in sorted(rows, key=lambda r: (_shape_key(r), r["peer"])):
        host, total = r.get("fwdbwd_host_ms"), r.get("fwdbwd_ms")
        if host and total and host >= share * total:
            masked = mask_name(r["causal"]) if isinstance(r["causal"], (tuple, list)) else (
                "causal" if r["causal"] else "non-causal")
            lines.append(f"- {r['peer']}, D={r['head_dim']} {masked} "
                         f"N={r['seqlen']}: {host:.3f} ms of host time a step against {total:.3f} ms timed")
    return "\n".join(lines)


def memory_table(rows):
    lines = ["| N | peer | time ms | peak extra GiB |", "|---|---|---|---|"]
    for r in rows:
        time_cell = f"{r['ms']:.1f}" if r["ms"] else r["error"]
        peak_cell = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "–"
        lines.append(f"| {r['seqlen']} | {r['peer']} | {time_cell} | {peak_cell} |")
    return "\n".join(lines)


def plot(rows, peers, path, key="tflops", what="forward"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("inputs", "random") == "random" and r.get("nheads_k", r["nheads"]) == r["nheads"]]
    if not rows:
        return
    panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        for peer in peers:
            pts = sorted((r["seqlen"], r[key]) for r in rows
                         if (r["head_dim"], r["causal"], r["peer"]) == (d, causal, peer) and r.get(key))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=peer, linewidth=2.5 if peer == "flashtile" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, causal {mask_name(causal)}")
        ax.set_xlabel("sequence length N (B·N = 16k)")
        ax.set_ylabel(f"TFLOP/s (bf16 {what})")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"),
                        help="a sliding window (flash-attn's window_size, -1 unbounded) instead of --causal")
    parser.add_argument("--inputs", nargs="+", default=["random"], choices=inputs.KINDS,
                        help="input distributions (flashtile/bench/inputs.py)")
    parser.add_argument("--gqa", action="store_true", help="also B=2, N=8k, 32 query / 8 KV heads, D=128")
    parser.add_argument("--peers", nargs="+", default=DEFAULT_PEERS, choices=list(FORWARD))
    parser.add_argument("--memory-seqlens", type=int, nargs="*",
                        default=[4096, 8192, 16384, 32768, 65536, 131072])
    parser.add_argument("--warmup", type=float, default=25, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=100, help="do_bench repeats, ms")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward")
    parser.add_argument("--rounds", type=int, default=2, help="turns each peer takes per shape; best kept")
    parser.add_argument("--out", default="results", help="folder for bench.json, bench.md and bench.png")
    parser.add_argument("--warm-gpu", type=float, default=15, help="seconds of matrix products before timing")
    args = parser.parse_args(argv)
    require_gpu("python -m flashtile.bench")
    os.makedirs(args.out, exist_ok=True)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if args.window:
        causals = [tuple(args.window)]
    started = time.time()
    warm_gpu(args.warm_gpu)
    rows = run_grid(list(grid(args.seqlens, args.head_dims, causals, args.inputs, args.gqa)), args.peers, args.warmup,
                    args.rep, args.rounds, args.backward)
    mem = memory_sweep(args.memory_seqlens) if args.memory_seqlens else []
    if args.memory_seqlens and args.backward:
        mem += memory_sweep([n for n in args.memory_seqlens if n <= 32768], backward=True)
    device = torch.cuda.get_device_name()
    header = (f"{device}, torch {torch.__version__}, triton {__import__('triton').__version__}, "
              f"bf16 forward TFLOP/s (median of do_bench, best of {args.rounds} turns, the GPU warmed for "
              f"{args.warm_gpu:g} s), {time.strftime('%Y-%m-%d')}")
    report = f"{header}\n\nForward:\n\n{table(rows, args.peers)}\n"
    if args.backward:
        bwd_table = table(rows, args.peers, "bwd_tflops", "bwd_error")
        report += f"\nBackward ((fwd+bwd) - fwd, 2.5x forward FLOPs):\n\n{bwd_table}\n"
        step_table = table(rows, args.peers, "fwdbwd_tflops", "bwd_error")
        report += f"\nForward + backward (3.5x forward FLOPs over the whole step):\n\n{step_table}\n"
        waited = host_bound(rows)
        report += ("\nSteps that waited on the host (its time to issue a forward + backward, without synchronizing, "
                   f"at least 90 % of the timed step):\n\n{waited or '- none'}\n")
    for backward in (False, True):
        part = [r for r in mem if r["backward"] == backward]
        if part:
            what = "forward + backward" if backward else "forward"
            report += f"\nMemory sweep, {what}, causal, B=1, H=16, D=128:\n\n{memory_table(part)}\n"
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(dict(device=device, torch=torch.__version__, forward=rows, memory=mem,
                       seconds=time.time() - started), f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(report)
    plot(rows, args.peers, os.path.join(args.out, "bench.png"))
    if args.backward:
        plot(rows, args.peers, os.path.join(args.out, "bench-bwd.png"), "bwd_tflops", "backward")
    print(report)


if __name__ == "__main__":
    main()
