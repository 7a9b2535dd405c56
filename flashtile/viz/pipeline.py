"""The sm90 forward's pipeline as it ran: a timeline recorded inside the kernel, and the page that draws it.

kernels/hopper/fwd.py marks its phases with Proton scopes (``pl.scope``: the loader warp's waits for a free stage
and its TMA loads; each consumer warpgroup's waits for K/V, for its turn at the tensor cores and for its products,
its softmax and its epilogue). They compile to nothing unless Proton's instrumentation is on; ``record`` turns it on
for one launch on an sm90 GPU and keeps, of a few programs, the loader warp and the first warp of each consumer
warpgroup (the other warps of a warpgroup run the same code). The trace file is JSON:

    {"meta": {shape, config, clock_mhz, the launch's µs with and without the records, ...}, "scopes": [names],
     "programs": [{"cta": i, "lanes": [
        {"warp": w, "role": "loader" | "consumer 0" | ..., "events": [[scope index, start, end], ...]}]}]}

times in SM clock cycles from the program's first record. ``summary`` reads the numbers the page shows off it.
"""
import json
import re
from pathlib import Path

from . import fill_template, script_json

HERE = Path(__file__).parent
SHIPPED = HERE / "pipeline_trace.json"
LOADER_SCOPES = ("wait Q free", "load Q", "wait stage free", "load K", "load V")
CONSUMER_SCOPES = ("wait Q", "wait K/V", "wait turn", "issue MMA", "wait QK", "softmax", "wait PV", "epilogue")
WAITS_FOR_PRODUCTS = ("wait QK", "wait PV")


def from_proton(chrome_trace, meta, programs=2):
    """Our trace of ``programs`` programs (CTAs) out of Proton's Chrome trace of one launch (a dict: its
    ``traceEvents``, pid "<kernel> Core<sm> CTA<cta>", tid "warp <w> (line <l>)", ts and dur in cycles / 1000)."""
    scopes = list(LOADER_SCOPES + CONSUMER_SCOPES)
    by_cta = {}
    for event in chrome_trace["traceEvents"]:
        cta = re.search(r"CTA(\d+)", str(event.get("pid", "")))
        warp = re.match(r"warp (\d+)", str(event.get("tid", "")))
        if event.get("ph") != "X" or not cta or not warp or event.get("name") not in scopes:
            continue
        start = round(event["ts"] * 1000)
        warps = by_cta.setdefault(int(cta.group(1)), {})
        warps.setdefault(int(warp.group(1)), []).append([scopes.index(event["name"]), start,
                                                         start + round(event["dur"] * 1000)])
    if not by_cta:
        raise RuntimeError("the Proton trace holds no record of the forward's scopes: was the kernel compiled with "
                           "Proton's instrumentation on (proton.start(..., backend='instrumentation'))?")
    out = []
    for cta in sorted(by_cta)[:programs]:
        lanes = _lanes(by_cta[cta], scopes)
        origin = min(e[1] for lane in lanes for e in lane["events"])
        for lane in lanes:
            lane["events"] = [[s, a - origin, b - origin] for s, a, b in sorted(lane["events"], key=lambda e: e[1])]
        out.append({"cta": cta, "lanes": lanes})
    return {"meta": meta, "scopes": scopes, "programs": out}


def _lanes(warps, scopes):
    """The loader warp (the one that loads K) and the first warp of each consumer warpgroup (warps that issue
    products, four to a warpgroup), each with its role."""
    loads, issues = scopes.index("load K"), scopes.index("issue MMA")
    loader = sorted(w for w, events in warps.items() if any(e[0] == loads for e in events))
    consumers = sorted(w for w, events in warps.items() if any(e[0] == issues for e in events))
    firsts = sorted({w // 4 * 4 for w in consumers})
    lanes = [{"warp": w, "role": "loader", "events": warps[w]} for w in loader[:1]]
    for i, group in enumerate(firsts):
        first = min(w for w in consumers if w // 4 * 4 == group)
        lanes.append({"warp": first, "role": f"consumer {i}", "events": warps[first]})
    return lanes


def _union(intervals):
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def in_flight(events, scopes):
    """A consumer lane's intervals with products on the tensor cores: from each "issue MMA" to the end of the last
    wait for products before the next issue (an upper bound: a product may finish before its wait ends)."""
    issue, waits = scopes.index("issue MMA"), {scopes.index(n) for n in WAITS_FOR_PRODUCTS}
    out, start, end = [], None, None
    for scope, a, b in events:
        if scope == issue:
            if start is not None and end is not None:
                out.append((start, end))
            start, end = a, None
        elif scope in waits and start is not None:
            end = b
    if start is not None and end is not None:
        out.append((start, end))
    return out


def summary(trace):
    """The page's numbers, from the trace alone: per program and their mean over the programs."""
    scopes, clock = trace["scopes"], trace["meta"]["clock_mhz"]
    rows = []
    for program in trace["programs"]:
        lanes = program["lanes"]
        span = max(e[2] for lane in lanes for e in lane["events"])
        consumers = [lane for lane in lanes if lane["role"].startswith("consumer")]
        loader = [lane for lane in lanes if lane["role"] == "loader"]

        def durations(lanes, name):
            return [b - a for lane in lanes for s, a, b in lane["events"] if scopes[s] == name]

        def share(name):
            return sum(durations(consumers, name)) / (span * len(consumers))
        kv_waits, stage_waits = durations(consumers, "wait K/V"), durations(loader, "wait stage free")
        busy = _union([i for lane in consumers for i in in_flight(lane["events"], scopes)])
        rows.append({"cta": program["cta"], "span_us": span / clock, "tensor_busy": busy / span,
                     "kv_wait_ns": 1000 * sum(kv_waits) / max(len(kv_waits), 1) / clock,
                     "kv_wait_share": share("wait K/V"), "softmax_share": share("softmax"),
                     "turn_wait_share": share("wait turn"),
                     "stage_wait_ns": 1000 * sum(stage_waits) / max(len(stage_waits), 1) / clock,
                     "kv_waits": len(kv_waits) // max(len(consumers), 1)})
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0] if key != "cta"}
    return {"programs": rows, "mean": mean}


def record(path, seqlen=4096, head_dim=128, nheads=16, programs=2):
    """Records one launch of the sm90 forward (batch 1, ``nheads`` heads, bf16, not causal) under Proton's
    instrumentation and writes our trace of ``programs`` programs to ``path``. Needs an sm90 GPU."""
    import os
    import tempfile

    import torch
    import triton
    import triton.profiler as proton

    from .. import dispatch, ops
    from ..kernels.hopper import fwd_launch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError("recording the pipeline needs an sm90 GPU (H100/H200)")
    q, k, v = (torch.randn(1, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = dispatch.forward(q, k, v, (-1, -1))
    unrecorded_ms = triton.testing.do_bench(lambda: ops.attention_forward(q, k, v, head_dim ** -0.5, (-1, -1), True))
    fwd_launch._REPLAYS.replays.clear()  # a replay would launch the kernel compiled without the records
    with tempfile.TemporaryDirectory() as folder:
        name = os.path.join(folder, "pipeline")
        proton.start(name, data="trace", backend="instrumentation", mode=proton.mode.Default(buffer_type="global"))
        ops.attention_forward(q, k, v, head_dim ** -0.5, (-1, -1), True)
        torch.cuda.synchronize()
        proton.finalize(output_format="chrome_trace")
        written = sorted(Path(folder).glob("pipeline*"))
        if not written:
            raise RuntimeError(f"Proton wrote no trace into {folder}")
        chrome = json.loads(written[0].read_text())
        clock = _sm_clock_mhz()
    fwd_launch._REPLAYS.replays.clear()
    meta = dict(kernel=plan.kernel, config=repr(plan.config), batch=1, nheads=nheads, seqlen=seqlen,
                head_dim=head_dim, causal=False, dtype="bf16", gpu=torch.cuda.get_device_name(), clock_mhz=clock,
                unrecorded_launch_us=1000 * unrecorded_ms)
    trace = from_proton(chrome, meta, programs)
    Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return trace


def _sm_clock_mhz():
    """The SM clock now (nvidia-smi), which the recorded cycles count."""
    import subprocess
    answer = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"],
                            capture_output=True, text=True, check=True)
    return float(answer.stdout.split()[0])


def load(path=None):
    """A recorded trace (the one shipped with the package by default)."""
    path = Path(SHIPPED if path is None else path)
    if not path.exists():
        raise FileNotFoundError(f"no recorded pipeline trace at {path}: record one on an sm90 GPU with "
                                "`flashtile viz --pipeline --record`")
    return json.loads(path.read_text())


def title(trace):
    m = trace["meta"]
    return (f"flashtile · the sm90 forward's pipeline, recorded: N={m['seqlen']}, D={m['head_dim']}, "
            f"{m['nheads']} heads, {m['dtype']}, {'causal' if m['causal'] else 'not causal'}, on {m['gpu']}")


def render(trace):
    """The pipeline page of a recorded trace, as an HTML string."""
    return fill_template("pipeline.html", NAME="TRACE", TITLE=title(trace),
                         STYLE=(HERE / "style.css").read_text(), DATA=script_json(trace),
                         SCRIPT=(HERE / "pipeline.js").read_text())
