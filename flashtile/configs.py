"""Tile configurations: plain data, one entry per (arch, padded head dim, causal), each with the run
that chose it. ``python -m flashtile.bench.tune`` re-runs the sweep; docs/perf.md keeps its output."""
from dataclasses import dataclass


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# sm90 (H200), bf16/fp16. Chosen by `python -m flashtile.bench.tune` (docs/perf.md, "Tile sweep"):
# the best median TFLOP/s over N in {2048, 4096, 16384} of B·N = 16k tokens, H·D = 2048.
FWD_SM90 = {
    (32, False): FwdConfig(128, 128, 4, 3),
    (32, True): FwdConfig(128, 128, 4, 3),
    (64, False): FwdConfig(128, 128, 8, 3),
    (64, True): FwdConfig(128, 128, 8, 3),
    (128, False): FwdConfig(128, 128, 8, 3),
    (128, True): FwdConfig(128, 128, 8, 3),
    (256, False): FwdConfig(128, 64, 8, 2),
    (256, True): FwdConfig(128, 64, 8, 2),
}

# Any other CUDA GPU: conservative tiles that fit 100 KB of shared memory.
FWD_GENERIC = {
    32: FwdConfig(128, 64, 4, 3),
    64: FwdConfig(128, 64, 4, 3),
    128: FwdConfig(128, 64, 8, 2),
    256: FwdConfig(64, 32, 4, 2),
}

# float32 inputs run the exact (ieee) dot: smaller tiles keep the operands in shared memory.
FWD_FP32 = {32: FwdConfig(64, 64, 4, 2), 64: FwdConfig(64, 64, 4, 2), 128: FwdConfig(64, 32, 4, 2),
            256: FwdConfig(32, 32, 4, 1)}

# The Triton interpreter (CPU): large tiles mean fewer Python-level steps.
FWD_INTERPRETER = FwdConfig(64, 64, 4, 1)


def fwd_config(head_dim_pad, causal, itemsize, arch, interpreter):
    """The forward tile config for a padded head dim, causal flag, element size and (major, minor) arch."""
    if interpreter:
        return FWD_INTERPRETER
    if itemsize == 4:
        return FWD_FP32[head_dim_pad]
    if arch == (9, 0):
        return FWD_SM90[(head_dim_pad, causal)]
    return FWD_GENERIC[head_dim_pad]
