"""The backward's host path with and without ops._ONE_PASS (a plain call's sm90 one-pass replays kept by its launch
key), in one process, taking turns: ``ops.attention_backward`` on the main thread and a whole eager step through
autograd, B=1, N=128, H=16, D=128, causal (kernels shorter than the host path). "first-call path" empties the cache
before every call, so that each takes dispatch, the launchers' keys and checks (and stores its replays again).
µs per call over 1,000 back-to-back calls, five turns. Run on an sm90 GPU: ``PYTHONPATH=. python3
scripts/one_pass_again_ab.py``."""
import torch

import flashtile
from flashtile import ops
from flashtile.bench.small_calls import per_call_us


def main():
    q, k, v, dout = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = ops.attention_forward(q, k, v, 0.088, (-1, 0), True)

    def backward():
        ops.attention_backward(dout, q, k, v, out, lse, 0.088, (-1, 0), True, False)
    backward()
    backward()
    found = next(iter(ops._ONE_PASS.items.values()), (None, ))[0]
    print("kept:", len(ops._ONE_PASS), None if found is None else [type(r).__name__ for r in found[2]])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        torch.autograd.grad(flashtile.flash_attn_func(*leaves, causal=True), leaves, dout)

    def first_call_path(fn):
        def run():
            ops._ONE_PASS.clear()
            fn()
        return run
    rows = {"ops.attention_backward, kept replays": backward,
            "ops.attention_backward, first-call path": first_call_path(backward),
            "forward + backward (autograd), kept replays": step,
            "forward + backward (autograd), first-call path": first_call_path(step)}
    times = {name: [] for name in rows}
    for _ in range(5):
        for name, fn in rows.items():
            for _ in range(50):
                fn()
            times[name].append(per_call_us(fn, 1000, torch.cuda.synchronize))
    print("| host path | µs per call, turns | min | median |\n|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {' / '.join(f'{t:.1f}' for t in ts)} | {min(ts):.1f} | {sorted(ts)[len(ts) // 2]:.1f} |")


if __name__ == "__main__":
    main()
