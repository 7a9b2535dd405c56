"""Tile configurations as data: the dataclasses each kernel family takes and the tables of shipped entries, keyed
by (padded head dim, causal) unless said otherwise. Each table has one line of why and a link to the measurements
that chose it (docs/configs.md); which entry serves a call is decided in flashtile/dispatch.py, and `flashtile info`
prints it. The environment variables that pick a kernel family are listed in docs/env.md."""
import os
from dataclasses import dataclass, fields, replace
from typing import Optional


def from_fields(cls, values):
    """``cls`` built from ``values`` in its fields' order (sweep candidate lists, command lines)."""
    return cls(**dict(zip((f.name for f in fields(cls)), values)))


# Which kernel family sm90 uses: "auto" (the Gluon kernels where they apply, else the portable ones) or "portable".
FWD_BACKEND = os.environ.get("FLASHTILE_FWD_BACKEND", "auto")
BWD_BACKEND = os.environ.get("FLASHTILE_BWD_BACKEND", "auto")
DECODE_BACKEND = os.environ.get("FLASHTILE_DECODE_BACKEND", "auto")


@dataclass(frozen=True, kw_only=True)
class TileConfig:
    block_m: int  # query rows per tile
    block_n: int  # key/value rows per tile
    num_warps: int
    num_stages: int


@dataclass(frozen=True, kw_only=True)
class BwdConfig:
    """One backward launch: K/V-tile programs (block_n1 keys, iterating Q tiles of block_m1 rows) and, when
    dQ is not summed by atomics, Q-tile programs (block_m2 rows, iterating K/V tiles of block_n2 keys)."""
    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    num_warps: int
    num_stages: int
    dq_atomic: str = "tma"  # "tma" bulk reduce-add per tile, "pointer" atomics, "none" Q-tile programs


@dataclass(frozen=True, kw_only=True)
class HopperFwdConfig:
    """The warp-specialized sm90 forward (kernels/hopper/fwd.py)."""
    block_m: int  # Q rows per program, 64 to each consumer warpgroup (two or three of them)
    block_n: int  # K/V rows per tile
    num_stages: int  # K/V tiles in the shared-memory ring
    consumer_regs: int = 240  # registers per thread of a consumer warpgroup (setmaxnreg)
    maxnreg: int = 168  # the cap at entry: 12 warps x 32 x 168 fit the 64K-register file (16 warps: 128)
    pingpong: bool = True  # the consumer warpgroups take turns (in a ring) issuing their products
    overlap_pv: bool = False  # run the softmax of tile j under P·V of tile j - 1
    persistent: bool = False  # one program per SM looping over pairs of Q tiles (else one per pair)
    persistent_max_seqlen: int = 1 << 31  # ... when the longest query sequence is at most this long
    min_seqlen_q: int = 0  # below this many query rows (the longest sequence) ``below`` runs instead
    o_kstage: bool = False  # D=128: O to 16-byte runs through each consumer's rows of the item's last K tile
    early_p: bool = False  # P to 16 bits at the end of each step (registers: not fp32 P beside the next S)
    q_regs: bool = False  # Q·Kᵀ reads Q from registers (the wgmma's A operand), not shared memory
    balanced: bool = True  # light items (last tiles that leave a consumer idle, one-tile middle pairs) last;
    # non-causal persistent grids take single Q tiles, not pairs
    claims: int = 0  # causal persistent grids, equal lengths: each program claims its next item from a counter as
    # it becomes free: pairs in head order, then single tiles heaviest first of the last heads, about this many rounds
    # of pairs (0: program p takes items p, p + grid, ...)
    frozen_max: bool = False  # every K/V tile after an item's first uses that tile's row maxima (no max, no rescale)
    o_tma: bool = False  # O by TMA stores from a shared-memory tile per consumer (D=128: in a third K/V stage's room)
    min_window: int = 0  # sliding windows of fewer keys a row (left + right + 1) run the portable kernel
    softcap: bool = True  # capped scores (softcap) take this config; else the portable kernel
    below: Optional["HopperFwdConfig"] = None  # the config below min_seqlen_q query rows (None: the portable kernel)


def hopper_fwd_chain(config):
    """``config`` and the configs it falls back to for fewer query rows (``below``), longest rows first."""
    while config is not None:
        yield config
        config = config.below


@dataclass(frozen=True, kw_only=True)
class HopperDqConfig:
    """The Gluon dQ kernel (kernels/hopper/bwd_dq.py): Q rows per program (half to each consumer warpgroup),
    keys per K/V tile, ring stages."""
    block_m: int = 128
    block_n: int = 64
    num_stages: int = 2
    consumer_regs: int = 240


@dataclass(frozen=True, kw_only=True)
class HopperBwdConfig:
    """The sm90 backward (kernels/hopper/bwd.py): the Gluon dK/dV kernel's tiles and the Gluon dQ kernel's
    (``dq_hopper``), which runs where the design has two kernels and always under deterministic=True."""
    block_m: int = 64  # Q rows per step
    block_n: int = 128  # keys per program, half to each consumer warpgroup (split_gradients: all to both)
    num_stages: int = 2  # Q/dO tiles in the shared-memory ring
    consumer_regs: int = 240
    dq_hopper: HopperDqConfig = HopperDqConfig()
    single_pass: bool = False  # dQ reduced in L2 from the dK/dV kernel (deterministic=True keeps two kernels)
    split_gradients: bool = False  # one warpgroup computes dV, the other dK, of the same keys (hopper/bwd_split.py)

    def design(self, deterministic=False):
        """How kernels/hopper/bwd.launch_bwd_hopper runs a call: "one pass", "two kernels" (dQ, then dK and dV) or
        "split gradients" (dQ, then dK and dV by a warpgroup each)."""
        if self.single_pass and not deterministic:
            return "one pass"
        return "split gradients" if self.split_gradients else "two kernels"

    def __post_init__(self):
        if self.single_pass and self.split_gradients:
            raise ValueError("HopperBwdConfig: single_pass adds dQ from the paired warpgroups, not split_gradients")
        if self.single_pass and self.block_m % 64:
            raise ValueError(f"HopperBwdConfig: single_pass hands dQ on in 64-row boxes, got block_m={self.block_m}")


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """The split-KV decode tiles (the query rows of a program are set by the group x new tokens)."""
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    key_groups: int = 1  # groups of block_n / key_groups keys per tile, each with its own softmax state
    heads: int = 1  # adjacent KV heads a program reads (block_n keys of each a tile), each with its own state
    max_rows: int = 128  # query rows a program takes at most: more fail to compile or overflow shared memory (sm90)


@dataclass(frozen=True, kw_only=True)
class DecodeHopperConfig:
    """The warp-specialized Gluon decode kernel (kernels/hopper/decode.py): keys per K/V tile, ring stages, the
    registers of each consumer warp and the launch's register cap (256 threads: 128 leave room for two programs an SM,
    168 for one)."""
    block_n: int = 64
    num_stages: int = 2
    consumer_regs: int = 168
    maxnreg: int = 128

    def per_sm(self, head_dim):
        """Programs an SM holds at once: its 64k registers and 227 KB of shared memory (the K and V ring)."""
        ring = 2 * self.num_stages * self.block_n * head_dim * 2 + 1024
        return min(65536 // (256 * self.maxnreg), 232448 // ring)


# ---- The portable kernels (kernels/portable/fwd.py, bwd.py, decode.py) ----

# sm90, bf16/fp16: 64x64 tiles, 4 warps, 3 stages had the best mean over 2k-16k (docs/configs.md#fwd_sm90).
FWD_SM90 = {(d, causal): TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
            for d in (32, 64, 128) for causal in (False, True)}
FWD_SM90.update({(256, causal): TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=2)
                 for causal in (False, True)})  # the smaller K/V tile fits D=256; not swept

# Any other CUDA GPU: conservative tiles that fit 100 KB of shared memory, not swept
# (docs/configs.md#fwd_generic-fwd_fp32-fwd_interpreter).
FWD_GENERIC = {32: TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3),
               64: TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3),
               128: TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
               256: TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)}
# float32 inputs run the exact (ieee) dot: smaller tiles keep the operands in shared memory.
FWD_FP32 = {32: TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            64: TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            128: TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
            256: TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)}
# The Triton interpreter (CPU): large tiles mean fewer Python-level steps.
FWD_INTERPRETER = TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=1)

# sm90, bf16/fp16: the best mean over 4k and 16k; dQ by bulk reduce-add at D=64, by Q-tile programs at D=128
# (docs/configs.md#bwd_sm90).
BWD_SM90 = {(d, causal): BwdConfig(block_m1=64, block_n1=64, block_m2=64, block_n2=64, num_warps=4, num_stages=3)
            for d in (32, 64) for causal in (False, True)}
BWD_SM90.update({
    (128, False): BwdConfig(block_m1=32, block_n1=64, block_m2=64, block_n2=64, num_warps=4, num_stages=3,
                            dq_atomic="none"),
    (128, True): BwdConfig(block_m1=64, block_n1=64, block_m2=64, block_n2=64, num_warps=4, num_stages=3,
                           dq_atomic="none"),
})
BWD_SM90.update({(256, causal): BwdConfig(block_m1=32, block_n1=64, block_m2=64, block_n2=32, num_warps=4,
                                          num_stages=2) for causal in (False, True)})  # not swept
BWD_GENERIC = {d: BwdConfig(block_m1=32, block_n1=64, block_m2=64, block_n2=32, num_warps=4, num_stages=2,
                            dq_atomic="pointer") for d in (32, 64, 128, 256)}
BWD_FP32 = {d: BwdConfig(block_m1=32, block_n1=32, block_m2=32, block_n2=32, num_warps=4, num_stages=1,
                         dq_atomic="pointer") for d in (32, 64, 128, 256)}
BWD_INTERPRETER = BwdConfig(block_m1=64, block_n1=64, block_m2=64, block_n2=64, num_warps=4, num_stages=1,
                            dq_atomic="pointer")

# Split-KV decode: 128 keys, 4 warps, 3 stages, the best tiles at D=128; max_rows: the most query rows
# whose tile compiles for sm90 (tests/tools/test_compile_sm90.py) (docs/configs.md#decode_sm90).
DECODE_SM90 = {32: DecodeConfig(block_n=128, num_warps=4, num_stages=3, max_rows=32),
               64: DecodeConfig(block_n=128, num_warps=4, num_stages=3, max_rows=32),
               128: DecodeConfig(block_n=128, num_warps=4, num_stages=3),
               256: DecodeConfig(block_n=64, num_warps=4, num_stages=3, max_rows=32)}
# One split whose (batch, KV head) programs fill the SMs in waves: 2 stages (docs/configs.md#decode_sm90_waves).
DECODE_SM90_WAVES = {128: DecodeConfig(block_n=128, num_warps=4, num_stages=2)}
# From DECODE_GROUPED_FROM keys a program, one group of keys per warp; below, the groups' merge costs more than their
# steps save (docs/configs.md#decode_key_groups).
DECODE_KEY_GROUPS, DECODE_GROUPED_FROM = 4, 32768
DECODE_GROUPED_MAX_ROWS = {32: 128, 64: 128, 128: 64, 256: 32}  # the groups' states take shared memory as rows grow
DECODE_INTERPRETER = DecodeConfig(block_n=64, num_warps=4, num_stages=1, key_groups=2)  # the CPU tests run the merge
DECODE_MIN_CHUNK = 256  # keys per split at least
DECODE_MAX_SPLITS = 16  # more splits only lengthen the merge (docs/configs.md#decode_sm90)
# Four KV heads a program where a key's heads sit side by side, from DECODE_HEADS_FROM keys a program with the
# programs filling the SMs; with fewer keys a loss (docs/configs.md#decode_heads_sm90).
DECODE_HEADS_SM90 = {128: DecodeConfig(block_n=32, num_warps=4, num_stages=3, heads=4, max_rows=16)}
DECODE_HEADS_FROM = 16384
# Paged caches, keyed (padded head dim, keys a TMA box or 0 for pointers): deeper rings hide the page id's load; four
# heads a box from DECODE_PAGED_HEADS_FROM keys a program where pages are under 64 keys
# (docs/configs.md#decode_paged_sm90).
DECODE_PAGED_SM90 = {(128, 128): DecodeConfig(block_n=128, num_warps=4, num_stages=5),
                     (128, 64): DecodeConfig(block_n=64, num_warps=4, num_stages=7, max_rows=32),
                     (128, 0): DecodeConfig(block_n=128, num_warps=4, num_stages=5)}
DECODE_PAGED_SM90_WAVES = {(128, 128): DecodeConfig(block_n=128, num_warps=4, num_stages=3),
                           (128, 64): DecodeConfig(block_n=64, num_warps=4, num_stages=7, max_rows=32),
                           (128, 0): DecodeConfig(block_n=64, num_warps=4, num_stages=5)}
DECODE_PAGED_HEADS_SM90 = {(128, 32): DecodeConfig(block_n=32, num_warps=4, num_stages=5, heads=4, max_rows=16),
                           (128, 16): DecodeConfig(block_n=16, num_warps=4, num_stages=8, heads=4, max_rows=16)}
DECODE_PAGED_HEADS_FROM = 4096

# ---- The sm90 Gluon kernels (kernels/hopper/: fwd.py, bwd.py, bwd_dq.py, bwd_split.py, decode.py) ----

# The forward (docs/configs.md#fwd_hopper): each field measured against the entry without it, in turns in one process.
FWD_HOPPER = {
    # 192-row tiles in three consumer warpgroups, P to 16 bits each step: from 1k rows ahead of the portable kernel
    # windows under 4096 keys and capped scores: the portable kernel was faster (docs/configs.md#fwd_hopper-windows)
    (64, False): HopperFwdConfig(block_m=192, block_n=128, num_stages=3, consumer_regs=160, maxnreg=128,
                                 persistent=True, early_p=True, frozen_max=True, min_seqlen_q=1024, min_window=4096,
                                 softcap=False),
    # three warpgroups claiming items from 2k rows; two warpgroups, no ping-pong, from 1k
    (64, True): HopperFwdConfig(block_m=192, block_n=128, num_stages=3, consumer_regs=160, maxnreg=128,
                                overlap_pv=True, persistent=True, claims=2, frozen_max=True,
                                min_seqlen_q=2048, softcap=False,
                                below=HopperFwdConfig(block_m=128, block_n=128, num_stages=3, pingpong=False,
                                                      persistent=True, claims=2, frozen_max=True,
                                                      min_seqlen_q=1024, softcap=False)),
    # two stages leave room for O's TMA tile; Q in registers from 2k rows (below, it lost); windows under 512 keys:
    # the portable kernel tied (docs/configs.md#fwd_hopper-windows)
    (128, False): HopperFwdConfig(block_m=128, block_n=128, num_stages=2, overlap_pv=True, persistent=True,
                                  o_kstage=True, early_p=True, q_regs=True, o_tma=True,
                                  frozen_max=True, min_seqlen_q=2048, min_window=512,
                                  below=HopperFwdConfig(block_m=128, block_n=128, num_stages=2, overlap_pv=True,
                                                        persistent=True, o_kstage=True, early_p=True,
                                                        o_tma=True, frozen_max=True, min_window=512)),
    # as non-causal, persistent only up to 4k rows; below 2k the light items keep their order
    (128, True): HopperFwdConfig(block_m=128, block_n=128, num_stages=2, overlap_pv=True, persistent=True,
                                 persistent_max_seqlen=4096, o_kstage=True, early_p=True, q_regs=True,
                                 o_tma=True, frozen_max=True, min_seqlen_q=2048,
                                 below=HopperFwdConfig(block_m=128, block_n=128, num_stages=2, overlap_pv=True,
                                                       persistent=True, persistent_max_seqlen=4096, o_kstage=True,
                                                       early_p=True, o_tma=True, balanced=False,
                                                       frozen_max=True)),
    # two 64-key stages beside the 64 KB Q tile, no ping-pong (docs/configs.md#fwd_hopper)
    (256, False): HopperFwdConfig(block_m=128, block_n=64, num_stages=2, pingpong=False, overlap_pv=True,
                                  persistent=True, early_p=True),
    (256, True): HopperFwdConfig(block_m=128, block_n=64, num_stages=2, pingpong=False, overlap_pv=True,
                                 persistent=True, early_p=True),
}

# The backward (docs/configs.md#bwd_hopper, #bwd_hopper-entries): a ring of 2 stages; the Gluon dQ kernel beat the
# portable tiles; at D=64 and D=128 the one pass beat the two kernels, and the portable backward from 512 keys.
BWD_HOPPER = {
    (128, False): HopperBwdConfig(dq_hopper=HopperDqConfig(block_n=128), single_pass=True),
    (128, True): HopperBwdConfig(dq_hopper=HopperDqConfig(), single_pass=True),
    # 128 query rows a step beat 64 (3 stages of them no longer fit)
    (64, False): HopperBwdConfig(block_m=128, dq_hopper=HopperDqConfig(block_n=128), single_pass=True),
    (64, True): HopperBwdConfig(block_m=128, dq_hopper=HopperDqConfig(block_n=128), single_pass=True),
    # one warpgroup per gradient: the only tiles whose two fp32 gradients fit; the portable kernel spills here
    (256, False): HopperBwdConfig(block_n=64, dq_hopper=HopperDqConfig(block_n=32), split_gradients=True),
    (256, True): HopperBwdConfig(block_n=64, dq_hopper=HopperDqConfig(block_n=32), split_gradients=True),
}

# Capped scores (softcap) on the sm90 backward, keyed as BWD_HOPPER: each beat the portable backward with the cap;
# D=64 in 64-row steps, whose 128 spill with a cap (docs/configs.md#bwd_hopper_softcap).
BWD_HOPPER_SOFTCAP = {
    **{(64, causal): replace(BWD_HOPPER[(64, causal)], block_m=64) for causal in (False, True)},
    **{key: BWD_HOPPER[key] for key in ((128, False), (128, True), (256, False), (256, True))},
}


def bwd_hopper_table(softcap):
    """The sm90 backward's table for a call: BWD_HOPPER_SOFTCAP with capped scores, else BWD_HOPPER."""
    return BWD_HOPPER_SOFTCAP if softcap else BWD_HOPPER


# The warp-specialized decode kernel on a head-major cache, one split, where its programs fill their waves to
# DECODE_HOPPER_FILL; 3 stages from DECODE_HOPPER_LONG_FROM keys (docs/configs.md#decode_hopper).
DECODE_HOPPER = {128: DecodeHopperConfig(block_n=64, num_stages=2, consumer_regs=168, maxnreg=128)}
DECODE_HOPPER_LONG = {128: DecodeHopperConfig(block_n=64, num_stages=3, consumer_regs=168, maxnreg=128)}
DECODE_HOPPER_LONG_FROM = 16384
DECODE_HOPPER_FILL = 0.9
DECODE_HOPPER_MIN_KEYS = 4096
