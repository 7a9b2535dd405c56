"""The sm90 Gluon kernels' PTX for every shipped launch variant (with --portable the portable kernels' too), without
debug info, to check that a refactor leaves the code the GPU runs unchanged (no GPU needed: triton compiles for sm90
here):

    TRITON_INTERPRET=0 python tools/ptx_snapshot.py before.json      # on the old tree
    TRITON_INTERPRET=0 python tools/ptx_snapshot.py after.json --compare before.json

The forward: each config of configs.FWD_HOPPER (its ``below`` chain too) at a length inside its range (and past
persistent_max_seqlen where that is set), bf16 and fp16, batch and packed (varlen). The backward: the dK/dV kernel of
each head dim and mask in one pass and in two kernels, D=256's split kernel (GQA and MHA), the dQ kernel computing
delta or reading it. Decoding: the Gluon decode kernel on key- and head-major caches.
"""
import argparse
import collections
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import compile_sm90  # noqa: E402

from flashtile import checks, configs  # noqa: E402
from flashtile.kernels.common.tiles import head_dim_pad  # noqa: E402
from flashtile.kernels.hopper import fwd as fwd_hopper  # noqa: E402
from flashtile.kernels.hopper import fwd_launch  # noqa: E402


def code_of(ptx):
    """The PTX's instructions and declarations: no line info and no DWARF sections, which move with the source."""
    kept = []
    for line in ptx.split("\n"):
        text = line.strip()
        if text.startswith((".loc", ".file", "//", ".b8", ".b32", ".b64", "$L__info", "$L__abbrev", "$L__pub",
                            "$L__line", "$L__tmp")) or "DW_" in line or "debug" in line:
            continue
        kept.append(line)
    return "\n".join(kept)


def opcodes(code):
    """How many times each instruction occurs in ``code`` (code_of's): equal counts with unequal code mean the same
    instructions in another order."""
    return collections.Counter(m.group(1) for m in re.finditer(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)", code, re.M))


def _ptx(compile_fn, *args):
    """The PTX that ``compile_fn`` (one of compile_sm90's compiles) hands over through compile_sm90.PTX_SINK."""
    sink = compile_sm90.PTX_SINK = []
    try:
        compile_fn(*args)
    finally:
        compile_sm90.PTX_SINK = None
    return code_of(sink.pop()[1])


def backward_and_decode():
    """{name: PTX} of the backward and decode kernels, through compile_sm90's functions."""
    jobs = []
    for (head_dim, causal), config in configs.BWD_HOPPER.items():
        if config.split_gradients:
            jobs += [(f"split D={head_dim} causal={causal} kv_heads={h}", compile_sm90.compile_hopper_split,
                      (causal, h, head_dim)) for h in (2, 8)]
        else:
            jobs += [(f"dkdv D={head_dim} causal={causal} one_pass={one}", compile_sm90.compile_hopper_bwd,
                      (causal, one, head_dim)) for one in (False, True)]
        jobs += [(f"dq D={head_dim} causal={causal} delta_in={d}", compile_sm90.compile_hopper_dq,
                  (causal, None, head_dim, d)) for d in (False, True)]
    jobs += [(f"decode layout={layout}", compile_sm90.compile_hopper_decode, (layout, )) for layout in ("key", "head")]
    out = {}
    for name, function, args in jobs:
        out[name] = _ptx(function, *args)
        print(name, len(out[name]), flush=True)
    return out


def features():
    """{name: PTX} of sliding windows, softcap and packed sequences on the sm90 kernels (compile_sm90's functions)."""
    fwd = configs.FWD_HOPPER
    jobs = [(f"fwd D={d} window={w}", compile_sm90.compile_hopper_fwd,
             (d, False, fwd[(head_dim_pad(d), False)], 1024, w)) for d in (64, 96, 128, 256)
            for w in ((256, 0), (128, 128), (-1, 64))]
    jobs += [("fwd D=128 packed window", compile_sm90.compile_hopper_fwd, (128, False, fwd[(128, False)], 1024,
                                                                              (256, 0), True))]
    jobs += [(f"fwd D={d} causal={c} softcap", compile_sm90.compile_hopper_fwd,
              (d, c, fwd[(d, c)], 1024, None, False, 30.0)) for d in (128, 256) for c in (False, True)]
    jobs += [(f"dkdv D={d} one_pass={one} window", compile_sm90.compile_hopper_bwd, (False, one, d, False, (256, 0)))
             for d in (64, 128) for one in (False, True)]
    jobs += [("dkdv D=128 packed window", compile_sm90.compile_hopper_bwd, (False, True, 128, True, (256, 0)))]
    jobs += [(f"split D=256 causal={c} window={w} softcap={cap} packed={p}", compile_sm90.compile_hopper_split,
              (c, 2, 256, w, cap, p)) for c, w, cap, p in ((False, (256, 0), 0.0, False), (True, None, 30.0, False),
                                                         (False, None, 30.0, True), (False, (-1, 64), 30.0, True))]
    jobs += [(f"dq D={d} window={w} softcap={cap} packed={p}", compile_sm90.compile_hopper_dq,
              (False, None, d, False, w, cap, p)) for d, w, cap, p in ((128, (256, 0), 0.0, False),
                                                                      (128, (256, 0), 0.0, True),
                                                                      (256, None, 30.0, False), (256, (128, 128), 30.0,
                                                                                                True))]
    out = {}
    for name, function, args in jobs:
        out[name] = _ptx(function, *args)
        print(name, len(out[name]), flush=True)
    return out


def portable():
    """{name: PTX} of the portable kernels: every shipped sm90 forward and backward tile config (compile_sm90's
    shipped jobs) and every split-KV decode launch the sm90 dispatch can pick."""
    jobs = [(fn, args) for fn, args in compile_sm90.shipped_jobs() if fn in (compile_sm90.compile_fwd,
                                                                              compile_sm90.compile_bwd)]
    jobs += [(compile_sm90.compile_decode, args) for args in compile_sm90.decode_launches()]
    out = {}
    for fn, args in jobs:
        key = f"portable {fn.__name__} {args}"
        out[key] = _ptx(fn, *args)
        print(key, len(out[key]), flush=True)
    return out


def snapshot(with_portable=False):
    out = backward_and_decode()
    out.update(features())
    if with_portable:
        out.update(portable())
    for (head_dim, causal), top in configs.FWD_HOPPER.items():
        for i, cfg in enumerate(configs.hopper_fwd_chain(top)):
            lengths = {max(cfg.min_seqlen_q, 1024) + 512}
            if cfg.persistent_max_seqlen < 8192:
                lengths.add(8192)
            for n in sorted(lengths):
                for dtype in (torch.bfloat16, torch.float16):
                    for varlen in (False, True):
                        if varlen:
                            q, k, v = (torch.empty(3 * n, 4, head_dim, dtype=dtype) for _ in range(3))
                            cu = torch.tensor([0, n, 2 * n, 3 * n], dtype=torch.int32)
                            lse, packed = torch.empty(4, 3 * n), (cu, cu, n)
                        else:
                            q, k, v = (torch.empty(2, n, 4, head_dim, dtype=dtype) for _ in range(3))
                            lse, packed = torch.empty(2, 4, n), (None, None, None)
                        _, args, kwargs = fwd_launch.launch_args(q, k, v, torch.empty_like(q), lse, *packed, 0.1,
                                                                 checks.window((-1, -1), causal), True, cfg)
                        key = f"D={head_dim} causal={causal} config {i} N={n} {dtype} varlen={varlen}"
                        out[key] = _ptx(compile_sm90._compile_gluon, fwd_hopper.flash_fwd_hopper_kernel, args,
                                        kwargs)
                        print(key, len(out[key]), flush=True)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--compare", help="a snapshot to compare with: exit 1 where any variant differs")
    parser.add_argument("--portable", action="store_true", help="the portable Triton kernels' shipped variants too")
    args = parser.parse_args()
    out = snapshot(args.portable)
    with open(args.out, "w") as f:
        json.dump(out, f)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        differ = sorted(k for k in out.keys() | before.keys() if out.get(k) != before.get(k))
        reordered = [k for k in differ if k in out and k in before and opcodes(out[k]) == opcodes(before[k])]
        print(f"{len(out) - len(differ)} of {len(out)} variants' PTX identical; the same instructions in another "
              f"order: {len(reordered)}", *(f"{k}{' (reordered)' if k in reordered else ''}" for k in differ),
              sep="\n")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
