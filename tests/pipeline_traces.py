"""Proton-shaped traces of a made-up sm90 forward program, for tests/viz (the real one is recorded on the GPU)."""


def proton_trace(ctas):
    """A Chrome trace in Proton's layout (pid "<kernel> Core<sm> CTA<i>", tid "warp <w> (line <l>)", ts and dur in
    cycles / 1000) of {cta: {warp: [(scope, start cycle, end cycle)]}}, programs starting 5000 cycles apart."""
    events = [{"ph": "M", "name": "process_name", "pid": "Kernel Call Path", "args": {"name": "x"}}]
    for cta, warps in ctas.items():
        for warp, spans in warps.items():
            for name, a, b in spans:
                events.append({"ph": "X", "name": name, "cat": "flash_fwd_hopper_kernel",
                               "pid": f"flash_fwd_hopper_kernel Core{cta + 7} CTA{cta}", "tid": f"warp {warp} (line 0)",
                               "ts": (a + 5000 * cta) / 1000, "dur": (b - a) / 1000})
    return {"displayTimeUnit": "ns", "traceEvents": events}


LOADER = [("wait Q free", 0, 2), ("load Q", 2, 4), ("wait stage free", 4, 10), ("load K", 10, 12),
          ("wait stage free", 12, 14), ("load V", 14, 16), ("wait stage free", 16, 50), ("load K", 50, 52)]
CONSUMER = [("wait Q", 0, 14), ("wait K/V", 14, 20), ("wait turn", 20, 20), ("issue MMA", 20, 22), ("wait QK", 22, 40),
            ("softmax", 40, 60), ("wait K/V", 60, 60), ("issue MMA", 60, 62), ("wait QK", 62, 80),
            ("softmax", 80, 100), ("wait PV", 100, 110), ("epilogue", 110, 120)]


def program(shift, stretch=1):
    """Warp 8 loads; warps 0-3 and 4-7 are the two consumer warpgroups, the second 20 cycles behind; every time
    ``stretch`` times as long, and ``shift`` cycles later."""
    warps = {8: LOADER}
    for w in range(8):
        warps[w] = [(n, a + (20 if w >= 4 else 0), b + (20 if w >= 4 else 0)) for n, a, b in CONSUMER]
    return {w: [(n, a * stretch + shift, b * stretch + shift) for n, a, b in spans] for w, spans in warps.items()}


META = dict(kernel="hopper/fwd.py", config="HopperFwdConfig()", batch=1, nheads=16, seqlen=4096, head_dim=128,
            causal=False, dtype="bf16", gpu="NVIDIA H200", clock_mhz=1000.0, unrecorded_launch_us=3.5)
