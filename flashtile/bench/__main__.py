"""``python -m flashtile.bench``: flashtile's forward against the peers, all in one process and run.

Grid as in the FlashAttention papers and ../shared/anchors/H200.md: B·N = 16k tokens, H·D = 2048,
N 512–16k, D 64 and 128, causal on and off, bf16. Writes a table (stdout and markdown), a JSON file,
a PNG of TFLOP/s against N, and a memory sweep (B=1, H=16, D=128, N up to 128k) against naive attention.
"""
import argparse
import json
import os
import sys
import time

import torch

from .peers import FORWARD

TOKENS, HIDDEN = 16384, 2048


def progress(items, desc):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=desc, file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        return items


def fwd_flops(batch, nheads, seqlen_q, seqlen_k, head_dim, causal):
    flops = 4 * batch * nheads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def bench_ms(fn, warmup=25, rep=100):
    import triton
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def is_oom(err):
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def time_peer(make, causal, q, k, v, warmup, rep):
    """Median ms of one peer, or the reason it could not run."""
    try:
        prepare, run = make(causal)
        args = prepare(q, k, v)
        run(*args)
        torch.cuda.synchronize()
        return bench_ms(lambda: run(*args), warmup, rep), None
    except Exception as err:  # a peer that cannot run this shape is reported, not fatal
        torch.cuda.synchronize()
        return None, "OOM" if is_oom(err) else f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    finally:
        torch.cuda.empty_cache()


def grid(seqlens, head_dims, causals):
    for head_dim in head_dims:
        for causal in causals:
            for seqlen in seqlens:
                yield dict(batch=max(1, TOKENS // seqlen), seqlen=seqlen, nheads=HIDDEN // head_dim,
                           head_dim=head_dim, causal=causal)


def run_grid(shapes, peers, warmup, rep, rounds):
    """Every peer on every shape; the peers take turns ``rounds`` times per shape and each keeps its best
    median, so a clock dip during one peer's turn does not decide the comparison."""
    rows = []
    for shape in progress(shapes, "forward grid"):
        b, n, h, d, causal = shape["batch"], shape["seqlen"], shape["nheads"], shape["head_dim"], shape["causal"]
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = fwd_flops(b, h, n, n, d, causal)
        best = {}
        for _ in range(rounds):
            for peer in peers:
                ms, error = time_peer(FORWARD[peer], causal, q, k, v, warmup, rep)
                if peer not in best or (ms and (best[peer][0] is None or ms < best[peer][0])):
                    best[peer] = (ms, error)
        for peer in peers:
            ms, error = best[peer]
            rows.append(dict(shape, peer=peer, ms=ms, tflops=flops / ms / 1e9 if ms else None, error=error))
        del q, k, v
    return rows


def memory_sweep(seqlens, peers=("flashtile", "naive"), nheads=16, head_dim=128):
    rows = []
    for n in progress(seqlens, "memory sweep"):
        for peer in peers:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            try:
                q, k, v = (torch.randn(1, n, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                base = torch.cuda.memory_allocated()
                ms, error = time_peer(FORWARD[peer], True, q, k, v, warmup=1, rep=3)
                peak = torch.cuda.max_memory_allocated() - base
                del q, k, v
            except Exception as err:
                ms, peak, error = None, None, "OOM" if is_oom(err) else type(err).__name__
            rows.append(dict(seqlen=n, peer=peer, ms=ms, peak_gib=peak / 2**30 if peak is not None and not error
                             else None, error=error))
    return rows


def table(rows, peers):
    """Markdown: one line per shape, TFLOP/s per peer, flashtile over the best other peer."""
    lines = ["| D | causal | N | B×H | " + " | ".join(peers) + " | ours / best peer |",
             "|---" * (len(peers) + 5) + "|"]
    keys = sorted({(r["head_dim"], r["causal"], r["seqlen"], r["batch"], r["nheads"]) for r in rows})
    for d, causal, n, b, h in keys:
        cells = {r["peer"]: r for r in rows if (r["head_dim"], r["causal"], r["seqlen"]) == (d, causal, n)}
        shown = [f"{cells[p]['tflops']:.0f}" if cells.get(p, {}).get("tflops") else
                 (cells.get(p, {}).get("error") or "–")[:12] for p in peers]
        others = [cells[p]["tflops"] for p in peers if p != "flashtile" and cells.get(p, {}).get("tflops")]
        ours = cells.get("flashtile", {}).get("tflops")
        ratio = f"{ours / max(others):.2f}" if ours and others else "–"
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {b}×{h} | " + " | ".join(shown) + f" | {ratio} |")
    return "\n".join(lines)


def memory_table(rows):
    lines = ["| N | peer | time ms | peak extra GiB |", "|---|---|---|---|"]
    for r in rows:
        time_cell = f"{r['ms']:.1f}" if r["ms"] else r["error"]
        peak_cell = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "–"
        lines.append(f"| {r['seqlen']} | {r['peer']} | {time_cell} | {peak_cell} |")
    return "\n".join(lines)


def plot(rows, peers, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        for peer in peers:
            pts = sorted((r["seqlen"], r["tflops"]) for r in rows
                         if (r["head_dim"], r["causal"], r["peer"]) == (d, causal, peer) and r["tflops"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=peer, linewidth=2.5 if peer == "flashtile" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length N (B·N = 16k)")
        ax.set_ylabel("TFLOP/s (bf16 forward)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--peers", nargs="+", default=list(FORWARD), choices=list(FORWARD))
    parser.add_argument("--memory-seqlens", type=int, nargs="*",
                        default=[4096, 8192, 16384, 32768, 65536, 131072])
    parser.add_argument("--warmup", type=float, default=25, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=100, help="do_bench repeats, ms")
    parser.add_argument("--rounds", type=int, default=2, help="turns each peer takes per shape; best kept")
    parser.add_argument("--out", default="results", help="folder for bench.json, bench.md and bench.png")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flashtile.bench needs a CUDA GPU; `flashtile demo` runs on the CPU under the interpreter")
    os.makedirs(args.out, exist_ok=True)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    started = time.time()
    rows = run_grid(list(grid(args.seqlens, args.head_dims, causals)), args.peers, args.warmup, args.rep,
                    args.rounds)
    mem = memory_sweep(args.memory_seqlens) if args.memory_seqlens else []
    device = torch.cuda.get_device_name()
    header = (f"{device}, torch {torch.__version__}, triton {__import__('triton').__version__}, "
              f"bf16 forward TFLOP/s (median of do_bench, best of {args.rounds} turns), {time.strftime('%Y-%m-%d')}")
    report = f"{header}\n\n{table(rows, args.peers)}\n"
    if mem:
        report += f"\nMemory sweep, causal, B=1, H=16, D=128:\n\n{memory_table(mem)}\n"
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(dict(device=device, torch=torch.__version__, forward=rows, memory=mem,
                       seconds=time.time() - started), f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(report)
    plot(rows, args.peers, os.path.join(args.out, "bench.png"))
    print(report)


if __name__ == "__main__":
    main()
