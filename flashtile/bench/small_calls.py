"""``python -m flashtile.bench.small_calls``: what one eager call costs where the kernels are tiny.

Short sequences and single decode-shaped tokens spend their time on the host (argument checks, dispatch, launch), not
on the GPU: a model's layers call attention back to back, so the figure of merit is the time per call of many calls
issued one after another, synchronized once at the end. Each peer takes its turn several times; the median of its
turns is reported, in µs per call, for the forward alone and for forward + backward (autograd). Writes small_calls.md
and small_calls.json to --out.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from . import require_gpu
from .__main__ import error_text

# (batch, seqlen, nheads, headdim, causal): a short prompt, one decode-shaped token, a short batch
SHAPES = [(1, 128, 16, 128, True), (1, 1, 32, 128, False), (8, 256, 16, 64, True)]


def per_call_us(fn, calls, sync):
    """Microseconds per call of ``calls`` back-to-back calls of ``fn``, with ``sync`` (the device's synchronize) once
    before and once after."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def turns(timers, rounds, calls, sync):
    """{name: median µs per call over ``rounds`` turns} of ``timers`` {name: fn}, each round starting one name later;
    a name whose call raised keeps the error's text instead."""
    names = list(timers)
    seen = {name: [] for name in names}
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            if isinstance(seen[name], str):
                continue
            try:
                seen[name].append(per_call_us(timers[name], calls, sync))
            except Exception as err:  # a peer that cannot run this shape is reported, not fatal
                seen[name] = error_text(err)
    return {name: v if isinstance(v, str) else statistics.median(v) for name, v in seen.items()}


def peers(batch, seqlen, nheads, head_dim, causal, backward):
    """{name: fn} of one call (forward, or forward + backward through autograd) on fresh bf16 inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import flash_attn_func
    q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=backward) for _ in range(3))
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(backward) for t in (q, k, v))
    dout = torch.randn_like(q)

    def step(attend, inputs, grad_out):
        if not backward:
            return lambda: attend(*inputs)
        return lambda: torch.autograd.grad(attend(*inputs), inputs, grad_out)

    def sdpa(backend):
        def attend(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return step(attend, (qt, kt, vt), dout.transpose(1, 2))
    return {
        "flashtile": step(lambda q, k, v: flash_attn_func(q, k, v, causal=causal), (q, k, v), dout),
        "FA2 (SDPA flash)": sdpa(SDPBackend.FLASH_ATTENTION),
        "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
    }


def table(rows, names):
    """Markdown: one line per (shape, mode), µs per call per peer, and flashtile over the fastest other peer
    (time over time: under 1 is faster)."""
    lines = ["| B | N | H | D | causal | mode | " + " | ".join(names) + " | flashtile / fastest peer |",
             "|---" * (len(names) + 7) + "|"]
    for r in rows:
        cells = [f"{r['us'][n]:.1f}" if isinstance(r["us"].get(n), float) else (r["us"].get(n) or "–")[:12]
                 for n in names]
        others = [r["us"][n] for n in names if n != "flashtile" and isinstance(r["us"].get(n), float)]
        ours = r["us"].get("flashtile")
        ratio = f"{ours / min(others):.2f}" if isinstance(ours, float) and others else "–"
        lines.append(f"| {r['batch']} | {r['seqlen']} | {r['nheads']} | {r['head_dim']} | "
                     f"{'yes' if r['causal'] else 'no'} | {r['mode']} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.small_calls", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="back-to-back calls a turn")
    parser.add_argument("--rounds", type=int, default=5, help="turns each peer takes per shape; the median is kept")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    require_gpu("python -m flashtile.bench.small_calls")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for batch, seqlen, nheads, head_dim, causal in SHAPES:
        for backward in (False, True):
            timers = peers(batch, seqlen, nheads, head_dim, causal, backward)
            for fn in timers.values():  # compile, allocate, pick algorithms: outside the timing
                try:
                    fn()
                except Exception:
                    pass
            us = turns(timers, args.rounds, args.calls, torch.cuda.synchronize)
            rows.append(dict(batch=batch, seqlen=seqlen, nheads=nheads, head_dim=head_dim, causal=causal,
                             mode="fwd+bwd" if backward else "fwd", us=us))
    names = list(rows[0]["us"])
    report = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}: µs per eager call, median of "
              f"{args.rounds} turns of {args.calls} back-to-back calls\n\n{table(rows, names)}\n")
    with open(os.path.join(args.out, "small_calls.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    with open(os.path.join(args.out, "small_calls.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
