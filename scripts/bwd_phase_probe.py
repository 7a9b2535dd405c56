"""Where a program of the sm90 one-pass backward spends its time: clock reads inside the dK/dV kernel, per program.

    PYTHONPATH=. python3 scripts/bwd_phase_probe.py [--cases 128,1,1024 128,1,16384 ...] [--json out.json]

The shipped kernels/hopper/bwd.py is copied with clock reads (%clock64, %smid, %globaltimer) written into a
[programs, 16] int64 table: the first consumer warpgroup's entry, K/V ready, first Q tile ready, first step done,
loop done, the last tile's dQ handed on and the copy engine's reads of dQ done, dK/dV stored; the second consumer's
entry and end; the loader's entry, its K/V issue and its end; the program's step count. Each case (D, causal, N at
B·N = 16k, H·D = 2048, bf16, O and LSE from the forward) prints the medians of each phase in µs, a step's cost early
and late, the gap on an SM between one program's end and the next one's start, and how busy the SMs were over the
launch (the tail). The probe's own cost: the backward's time with and without the records (do_bench medians).
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from bwd_ab import HIDDEN, TOKENS, load_old

from flashtile import checks, configs, ops
from flashtile.kernels.hopper import bwd

SLOTS = 16
CLOCK = '''
REC_TABLE = [None]  # the records' table of the next launch (launch_args hands it to the kernel)


@gluon.jit
def _rec(REC, slot, value):
    pid = gl.program_id(0) + gl.num_programs(0) * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
    gl.store(REC + pid.to(gl.int64) * 16 + slot, value.to(gl.int64))


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _ns():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _smid():
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _program(BLOCK_N'''

# (old, new, count): text replacements that turn bwd.py into the probe
PATCHES = [
    ("\n\n@gluon.jit\ndef _program(BLOCK_N", CLOCK, 1),
    ("def _load_partition(sw, smem, vw, q_desc, k_desc, v_desc, do_desc, LSE, Delta, stride_lb, stride_lh, diag,\n"
     "                    diag_left, group, cu_seqlens_q, cu_seqlens_k):",
     "def _load_partition(sw, smem, vw, q_desc, k_desc, v_desc, do_desc, LSE, Delta, stride_lb, stride_lh, diag,\n"
     "                    diag_left, group, cu_seqlens_q, cu_seqlens_k, REC):\n    _rec(REC, 10, _clock())", 1),
    ("smem.kv_bar, smem.v.index(i))\n    lo, hi",
     "smem.kv_bar, smem.v.index(i))\n    _rec(REC, 11, _clock())\n    lo, hi", 1),
    ("        mbarrier.arrive(smem.q_ready.index(stage))  # q_ready's second arrival: the rows are stored\n",
     "        mbarrier.arrive(smem.q_ready.index(stage))  # q_ready's second arrival: the rows are stored\n"
     "    _rec(REC, 12, _clock())\n", 1),
    ("def _consumer(half: gl.constexpr, sw, smem, vw, gr, dQacc, diag, diag_left, group, qk_scale, cu_seqlens_q,\n"
     "              cu_seqlens_k):",
     "def _consumer(half: gl.constexpr, sw, smem, vw, gr, dQacc, diag, diag_left, group, qk_scale, cu_seqlens_q,\n"
     "              cu_seqlens_k, REC):\n"
     "    if half == 0:\n        _rec(REC, 1, _ns())\n        _rec(REC, 2, _clock())\n        _rec(REC, 0, _smid())\n"
     "    else:\n        _rec(REC, 8, _clock())", 1),
    ("    lo, hi = _q_tiles(sw, start_n, seqlen_q, seqlen_k, diag, diag_left)\n"
     "    TILE_ROWS",
     "    lo, hi = _q_tiles(sw, start_n, seqlen_q, seqlen_k, diag, diag_left)\n"
     "    if half == 0:\n        _rec(REC, 3, _clock())\n        _rec(REC, 13, group * (hi - lo))\n"
     "    TILE_ROWS", 1),
    ("        mbarrier.wait(smem.q_ready.index(stage), phase)\n        s_t = warpgroup_mma(",
     "        mbarrier.wait(smem.q_ready.index(stage), phase)\n"
     "        if half == 0:\n            if t == 0:\n                _rec(REC, 4, _clock())\n"
     "        s_t = warpgroup_mma(", 1),
    ("        mbarrier.arrive(smem.q_free.index(stage))\n    if sw.DQ_REDUCE:\n",
     "        mbarrier.arrive(smem.q_free.index(stage))\n"
     "        if half == 0:\n            if t == 0:\n                _rec(REC, 15, _clock())\n"
     "    if half == 0:\n        _rec(REC, 5, _clock())\n"
     "    if sw.DQ_REDUCE:\n", 1),
    ("        tma.store_wait(0)\n    k_base",
     "        tma.store_wait(0)\n    if half == 0:\n        _rec(REC, 6, _clock())\n    k_base", 1),
    ("\n\n\n@gluon.jit\ndef flash_bwd_dkdv_hopper_kernel(",
     "\n    if half == 0:\n        _rec(REC, 7, _clock())\n        _rec(REC, 14, _ns())\n"
     "    else:\n        _rec(REC, 9, _clock())\n\n\n@gluon.jit\ndef flash_bwd_dkdv_hopper_kernel(", 1),
    ("cu_seqlens_k, HEAD_DIM: gl.constexpr", "cu_seqlens_k, REC, HEAD_DIM: gl.constexpr", 1),
    ("group, qk_scale, cu_seqlens_q, cu_seqlens_k)),", "group, qk_scale, cu_seqlens_q, cu_seqlens_k, REC)),", 2),
    ("diag_left, group, cu_seqlens_q, cu_seqlens_k)),", "diag_left, group, cu_seqlens_q, cu_seqlens_k, REC)),", 1),
    ("    kwargs = dict(HEAD_DIM=q.shape[-1],", "    kwargs = dict(REC=REC_TABLE[0], HEAD_DIM=q.shape[-1],", 1),
]


def probe_module():
    """kernels/hopper/bwd.py with the clock reads, as flashtile.kernels.hopper._bwd_probe."""
    source = Path(bwd.__file__).read_text()
    for old, new, count in PATCHES:
        if source.count(old) != count:
            raise RuntimeError(f"bwd.py changed: {old[:60]!r} found {source.count(old)} times, expected {count}")
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "_bwd_probe.py"
    path.write_text(source)
    return load_old(str(path), "_bwd_probe", "flashtile.kernels.hopper")


def clock_mhz():
    """The SM clock now (nvidia-smi), MHz: the clock reads' cycles per µs."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return float(out.split()[0])


def launch(module, q, k, v, dout, out, lse, causal):
    """(dq, dk, dv) by ``module``'s launch_bwd_hopper (the shipped bwd or the probe)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    module.launch_bwd_hopper(dout, q, k, v, out, lse, dq, dk, dv, q.shape[-1] ** -0.5, checks.window((-1, -1), causal),
                             True)
    return dq, dk, dv


def med(values):
    """The median, NaN for none."""
    return statistics.median(values) if values else float("nan")


def summarize(table, cycles_per_us):
    """The phases' medians (µs) and the launch's shape from the table's rows (one per program)."""
    rows = table.tolist()
    us = lambda c: c / cycles_per_us  # noqa: E731
    phases = {
        "K/V ready (from entry)": [r[3] - r[2] for r in rows],
        "first Q ready (from K/V ready)": [r[4] - r[3] for r in rows if r[13] > 0],
        "first step": [r[15] - r[4] for r in rows if r[13] > 0],
        "later steps, each": [(r[5] - r[15]) / (r[13] - 1) for r in rows if r[13] > 1],
        "dQ reads drained": [r[6] - r[5] for r in rows],
        "dK/dV stored": [r[7] - r[6] for r in rows],
        "program (entry to last end)": [max(r[7], r[9], r[12]) - min(r[2], r[8], r[10]) for r in rows],
    }
    out = {name: us(med(v)) for name, v in phases.items()}
    steps = [r[13] for r in rows]
    out["steps per program (mean)"] = sum(steps) / len(steps)
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r[0], []).append((min(r[2], r[8], r[10]), max(r[7], r[9], r[12])))
    gaps, busy, span = [], 0, 0
    for spans in by_sm.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        busy += sum(b - a for a, b in spans)
        span = max(span, spans[-1][1] - spans[0][0])
    out["gap between programs on an SM"] = us(med(gaps))
    out["programs per SM (max)"] = max(len(s) for s in by_sm.values())
    out["SM busy share of the longest SM's span"] = busy / (len(by_sm) * span) if span else float("nan")
    out["launch span (globaltimer, µs)"] = (max(r[14] for r in rows) - min(r[1] for r in rows)) / 1000
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["128,1,1024", "128,1,16384", "128,0,1024", "64,1,1024"],
                        help="D,causal,N")
    parser.add_argument("--json", help="write the summaries and raw tables here")
    args = parser.parse_args()
    module = probe_module()
    results = []
    for case in args.cases:
        d, causal, n = (int(x) for x in case.split(","))
        causal = bool(causal)
        b, h = max(1, TOKENS // n), HIDDEN // d
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = ops.attention_forward(q, k, v, d ** -0.5, (-1, 0) if causal else (-1, -1), True)
        grid = (triton.cdiv(n, configs.BWD_HOPPER[(d, causal)].block_n), h, b)  # (K/V tiles, KV heads, batch)
        rec = torch.full((grid[0] * grid[1] * grid[2], SLOTS), -1, device="cuda", dtype=torch.int64)
        module.REC_TABLE[0] = rec
        module._REPLAYS.replays.clear()  # a launch replayed from an earlier case would write that case's table
        ref = launch(bwd, q, k, v, dout, out, lse, causal)
        got = launch(module, q, k, v, dout, out, lse, causal)
        diff = max((a.float() - c.float()).abs().max().item() for a, c in zip(ref, got))
        ms = {name: statistics.median(triton.testing.do_bench(fn, return_mode="median") for _ in range(3))
              for name, fn in (("shipped", lambda: launch(bwd, q, k, v, dout, out, lse, causal)),
                               ("probe", lambda: launch(module, q, k, v, dout, out, lse, causal)))}
        mhz = clock_mhz()
        rec.fill_(-1)
        launch(module, q, k, v, dout, out, lse, causal)
        torch.cuda.synchronize()
        table = rec.cpu()
        missing = int((table[:, :13] < 0).any(dim=1).sum())
        summary = summarize(table, mhz)  # (cycles per µs: the clock read after the timing, so approximate)
        summary.update({"D": d, "causal": causal, "N": n, "B": b, "H": h, "grid": list(grid), "SM MHz": mhz,
                        "backward ms shipped": ms["shipped"], "backward ms probe": ms["probe"],
                        "programs without every record": missing, "max |probe - shipped| grads": diff})
        print(f"\n### D={d} causal={causal} N={n} (B={b}, H={h}, grid {grid})")
        for key, value in summary.items():
            print(f"- {key}: {value:.3f}" if isinstance(value, float) else f"- {key}: {value}", flush=True)
        results.append({"summary": summary, "table": table.tolist()})
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
