"""Tile configurations: plain data, one entry per (arch, padded head dim, causal), each with the run
that chose it. ``python -m flashtile.bench.tune`` re-runs the sweep; docs/perf.md keeps its output."""
import os
from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile
    block_n: int  # key/value rows per tile
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
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


# sm90 (H200), bf16/fp16. Chosen by `python -m flashtile.bench.tune` on 2026-11-29 (docs/results/tune-v2.md):
# 64x64 tiles, 4 warps, 3 stages had the best mean TFLOP/s over N in {2k, 4k, 8k, 16k} (B·N = 16k,
# H·D = 2048) at D=128 causal and not and D=64 causal; at D=64 non-causal it tied 128x128x4x3 (440 vs 441).
# Two such programs fit on one SM, so one's softmax overlaps the other's matrix products.
# D=32 and D=256 were not swept: 32 reuses the 64 choice; 256 needs the smaller K/V tile to fit.
FWD_SM90 = {
    (32, False): TileConfig(64, 64, 4, 3),
    (32, True): TileConfig(64, 64, 4, 3),
    (64, False): TileConfig(64, 64, 4, 3),
    (64, True): TileConfig(64, 64, 4, 3),
    (128, False): TileConfig(64, 64, 4, 3),
    (128, True): TileConfig(64, 64, 4, 3),
    (256, False): TileConfig(128, 64, 8, 2),
    (256, True): TileConfig(128, 64, 8, 2),
}

@dataclass(frozen=True)
class HopperFwdConfig:
    """The warp-specialized sm90 forward (kernels/fwd_hopper.py)."""
    block_m: int  # Q rows per program, 64 to each consumer warpgroup (two or three of them)
    block_n: int  # K/V rows per tile
    num_stages: int  # K/V tiles in the shared-memory ring
    consumer_regs: int = 240  # registers per thread of a consumer warpgroup (setmaxnreg)
    maxnreg: int = 168  # the cap at entry: 12 warps x 32 x 168 fit the 64K-register file (16 warps: 128)
    pingpong: bool = True  # the consumer warpgroups take turns (in a ring) issuing their products
    overlap_pv: bool = False  # run the softmax of tile j under P·V of tile j - 1
    persistent: bool = False  # one program per SM looping over pairs of Q tiles (else one per pair)
    persistent_max_seqlen: int = 1 << 31  # ... when the longest query sequence is at most this long
    exp2_fma: int = 0  # one in this many exponentials of P by polynomial on the FMA units (0: none)
    min_seqlen_q: int = 0  # below this many query rows (the longest sequence) ``below`` runs instead
    o_kstage: bool = False  # D=128: O to 16-byte runs through each consumer's rows of the item's last K tile
    early_p: bool = False  # P to 16 bits at the end of each step (registers: not fp32 P beside the next S)
    q_regs: bool = False  # Q·Kᵀ reads Q from registers (the wgmma's A operand), not shared memory
    lane_sums: bool = False  # each thread keeps its share of the row sums; the quad adds them once per item
    skip_idle: bool = True  # a consumer whose rows all lie past the sequence (a ragged last tile) only passes turns
    balanced: bool = True  # light items (last tiles that leave a consumer idle, one-tile middle pairs) last;
    # non-causal persistent grids take single Q tiles, not pairs
    claims: int = 0  # causal persistent grids, equal lengths: each program claims its next item from a counter as
    # it becomes free: pairs in head order, then single tiles heaviest first of the last heads, about this many rounds
    # of pairs (0: program p takes items p, p + grid, ...)
    frozen_max: bool = False  # every K/V tile after an item's first uses that tile's row maxima (no max, no rescale)
    o_tma: bool = False  # O by TMA stores from a shared-memory tile per consumer (D=128: in a third K/V stage's room)
    below: Optional["HopperFwdConfig"] = None  # the config below min_seqlen_q query rows (None: the portable kernel)


def hopper_fwd_chain(config):
    """``config`` and the configs it falls back to for fewer query rows (``below``), longest rows first."""
    while config is not None:
        yield config
        config = config.below


# sm90, bf16/fp16, keyed (head dim, causal). `python -m flashtile.bench.tune --hopper` on 2026-11-29
# (docs/results/tune-hopper-v2.md): 128 query rows (64 per consumer warpgroup), 128-key tiles, ping-pong and
# three K/V stages: D=128 647 TFLOP/s mean non-causal (two stages 531-550, 64-key tiles 495). Then
# (tune-hopper-v4-pairs.md, N = 1k/2k/4k/16k; programs take pairs of Q tiles of equal causal work):
# non-causal, the persistent grid with the softmax under the previous P·V: 547/625/601/629 against
# 501/582/595/609 with neither. Causal, the persistent grid without the overlap: 396/503/546/588 against
# 355/471/536/617 with one program per pair, so persistent only up to 4k query rows (the overlap: 355/482/
# 533/612, and 104 bytes of spills). D=256 fits two 64-key stages beside its 64 KB Q tile (its switches: run 26).
# D=64 (docs/results/bench-v7.md, same run as the portable kernel, N = 1k/2k/4k/8k/16k): non-causal, the
# persistent grid with the overlap 387/423/434/443/448 against the portable 426/414/422/429/437, so from 2k
# query rows; causal 284/357/395/420/438 against 325/361/392/438/425, no clear win: causal stays portable.
# Run 18 (tune-hopper-v9-3wg.md, N = 1k/4k/16k): D=64 in 192-row tiles, three consumer warpgroups of 160
# registers, non-causal persistent 397/488/499 against 388/445/445 with two warpgroups and 419/469/438 portable
# (cuDNN 437/475/496); causal 163/368/447 against the portable 327/416/425. At 2k/8k (tune-hopper-v9-3wg-b.md)
# 447/516 against the portable 457/453 (cuDNN 467/492): three warpgroups from 4k query rows, causal portable.
# Run 20 (fwd-o-store-d128.md, N = 1k/2k/4k/16k): D=128 with O through the last K tile (o_kstage) 581/597/604/613
# non-causal, 409/516/539/585 causal, against 541/585/593/612 and 394/484/527/579 without, in one call. With
# it, causal with the overlap (36 bytes of spills, 104 before) 416/515/563/601 against 409/506/539/582 without,
# taking turns in one process (fwd-configs-d128-kstage.md; non-causal without the overlap 570/597/596/611).
# Run 21 (fwd-d64-causal-mask.md, one process each tree, N = 1k/2k/4k/8k/16k): with one compare per masked
# score, D=64 causal in 192-row tiles with the overlap 216/333/411/454/473 and in two warpgroups 312/375/398/415/427
# against the portable 315/361/388/406/411 (cuDNN 337/387/417/440/457): three from 4k rows, two from 2k. Non-causal
# three warpgroups at 1k/2k 423/442 against the portable 412/422 (fwd-d64-overlap.md): from 1k rows.
# Run 22 (fwd-d64-pingpong.md, N = 1k/2k/3k/4k): causal two warpgroups without ping-pong 319/380/398/411 against
# 309/369/390/403 with it; three warpgroups and D=128 keep it (without: causal -1 to -3 %, D=128 non-causal -2 to
# -4 %, D=64 non-causal -3 % to +0.2 %).
# Run 23 (fwd-early-p.md, N = 1k/2k/4k/8k/16k, two alternating processes each): D=128 with P turned to 16 bits at
# the end of each step (early_p; spills 32/28 bytes -> 0) and each stage's K freed after Q·Kᵀ, V after P·V:
# non-causal 601/625/615/625/630 and 600/597/614/623/628 against 588/604/616/620/625 and 586/603/611/621/620,
# causal 445/544/579/591/606 and 429/527/573/590/616 against 426/521/570/580/604 and 413/511/556/579/606. D=64
# with early_p: within the spread non-causal, causal three warpgroups -6 % at 4k (kept off). Two stages tie three,
# which leaves room for an O tile per consumer (o_tma; fwd-o-tma-smem.md, one process, N = 1k/4k/8k/16k): non-causal
# 570/610/612/618 against 547/596/610/612 with three stages and O through the K tile, causal 450/566/580/596 against
# 429/560/576/596. o_kstage stays for outputs laid out unlike Q, which the TMA store does not take.
# Run 24 (fwd-q-regs.md, N = 1k/2k/4k/8k/16k, variants taking turns in one process, two calls): Q·Kᵀ with Q in
# registers (q_regs) non-causal 599/624/613/627/629 and 602/645/634/641/646 against 617/603/604/609/611 and
# 625/628/621/631/627, causal 437/546/559/574/591 and 454/565/585/591/612 against 440/543/554/569/583 and
# 454/562/579/591/608: from 2k rows (at 1k -3 and -4 % non-causal). Each thread's share of the row sums added
# across the quad once per item (lane_sums; 4 shuffles and 4 adds fewer per step), in columns taking rotating turns
# (fwd-lane-sums.md): D=128 non-causal 619/625 against 582/609 at 1k/2k, causal 446/541 against 438/532; D=64
# 425/440/489 against 404/435/480 non-causal at 1k/2k/4k, causal 381/425 against 373/418 at 2k/4k.
# Run 25 (fwd-skip-balanced.md, columns rotating): warpgroups past the sequence skip a cut-short last tile
# (skip_idle) and light items go last, non-causal persistent grids taking single tiles (balanced): D=64 non-causal
# 446/476/496/518/525 against 406/442/490/501/506 at 1k-16k; D=128 non-causal +0.6 to +3 %. D=128 causal below 2k
# rows without the order: with it 416 against 432 at 1000 rows (that path spills 32 bytes). D=256, not measured, keeps
# the previous order (with it, 24 bytes of spills where it had none).
# Run 26 (fwd-d256.md, N = 1k/2k/4k/8k/16k, columns rotating): D=256 with the persistent grid, light items last, the
# softmax under P·V, P to 16 bits each step, row sums per lane and no turns: non-causal 566/622/643/657/682 against
# 536/583/596/614/650 with none of them, causal 414/528/585/629/693 against 391/497/525/582/642 (with turns
# 552/618/627/642/658 and 418/524/581/636/654).
# Run 28 (fwd-claims.md, columns rotating): D=64 causal from 4k rows with each program claiming its next item from a
# counter (claims=2) 451/484/505 at 4k/8k/16k against the static order's 450/472/485 (at 8k/16k in a second call
# 501/508 against 483/490). Not elsewhere: D=128 causal 1k-4k 0 to -7 % (likely, not profiled: the tail's single tiles
# run more heads' K and V through L2 at once), D=64 causal's two warpgroups at 2k -1 to -2 %. With claims, three
# warpgroups from 2k rows (fwd-claims.md, call 10) 398/412/412/436/443 at 2k/2.25k/2.5k/3k/3.5k against two
# warpgroups' 385/385/398/404/412 (cuDNN 385/396/400/411/414): the two-warpgroup config goes, the portable kernel runs
# below 2k.
# Runs 30-31 (fwd-frozen-max-v42.md, fwd-v43-run31.md, columns rotating): every tile after an item's first against
# that tile's row maxima (frozen_max) +6 to +16 % at D=64/128, both masks, 1k-16k; with it D=64 causal runs two
# warpgroups from 1k rows, claiming items (claims=2) 342 against 327 without claims (cuDNN 337); D=64 non-causal
# with P to 16 bits each step (early_p) 577/595 against 550/547 at 4k/16k (the overlap 587/593, 88 bytes of spills).
FWD_HOPPER = {
    (64, False): HopperFwdConfig(192, 128, 3, 160, 128, persistent=True, early_p=True, lane_sums=True,
                                 frozen_max=True, min_seqlen_q=1024),
    (64, True): HopperFwdConfig(192, 128, 3, 160, 128, overlap_pv=True, persistent=True, lane_sums=True, claims=2,
                                frozen_max=True, min_seqlen_q=2048,
                                below=HopperFwdConfig(128, 128, 3, pingpong=False, persistent=True, lane_sums=True,
                                                      claims=2, frozen_max=True, min_seqlen_q=1024)),
    (128, False): HopperFwdConfig(128, 128, 2, overlap_pv=True, persistent=True, o_kstage=True, early_p=True,
                                  q_regs=True, lane_sums=True, o_tma=True, frozen_max=True, min_seqlen_q=2048,
                                  below=HopperFwdConfig(128, 128, 2, overlap_pv=True, persistent=True, o_kstage=True,
                                                        early_p=True, lane_sums=True, o_tma=True, frozen_max=True)),
    (128, True): HopperFwdConfig(128, 128, 2, overlap_pv=True, persistent=True, persistent_max_seqlen=4096,
                                 o_kstage=True, early_p=True, q_regs=True, lane_sums=True, o_tma=True,
                                 frozen_max=True, min_seqlen_q=2048,
                                 below=HopperFwdConfig(128, 128, 2, overlap_pv=True, persistent=True,
                                                       persistent_max_seqlen=4096, o_kstage=True, early_p=True,
                                                       lane_sums=True, o_tma=True, balanced=False, frozen_max=True)),
    (256, False): HopperFwdConfig(128, 64, 2, pingpong=False, overlap_pv=True, persistent=True, early_p=True,
                                  lane_sums=True),
    (256, True): HopperFwdConfig(128, 64, 2, pingpong=False, overlap_pv=True, persistent=True, early_p=True,
                                 lane_sums=True),
}

# Which forward kernel sm90 uses: "auto" (the Hopper kernel where it applies, else the portable one) or
# "portable" (tests and benchmarks compare the two).
FWD_BACKEND = os.environ.get("FLASHTILE_FWD_BACKEND", "auto")

# The backward: "auto" (kernels/bwd_hopper.py where its config's min_seqlen_k allows, else kernels/bwd.py),
# "hopper" (bwd_hopper wherever it applies: sm90, D=64/128/256, bf16/fp16, batch mode, full or causal) or "portable".
BWD_BACKEND = os.environ.get("FLASHTILE_BWD_BACKEND", "auto")


@dataclass(frozen=True)
class HopperDqConfig:
    """The Gluon dQ kernel (kernels/bwd_dq_hopper.py): Q rows per program (half to each consumer warpgroup),
    keys per K/V tile, ring stages."""
    block_m: int = 128
    block_n: int = 64
    num_stages: int = 2
    consumer_regs: int = 240


@dataclass(frozen=True)
class HopperBwdConfig:
    """The sm90 backward (kernels/bwd_hopper.py): the Gluon dK/dV kernel's tiles and the dQ kernel's: the
    portable Q-tile programs (``dq``: its block_m2, block_n2, warps, stages) or, with ``dq_hopper``, the Gluon
    dQ kernel."""
    dq: Optional[BwdConfig] = None
    block_m: int = 64  # Q rows per step
    block_n: int = 128  # keys per program, half to each consumer warpgroup (split_gradients: all to both)
    num_stages: int = 2  # Q/dO tiles in the shared-memory ring
    consumer_regs: int = 240
    min_seqlen_k: int = 2048  # "auto" takes it from here: it was measured from 2k keys up
    dq_hopper: Optional[HopperDqConfig] = None
    single_pass: bool = False  # dQ reduced in L2 from the dK/dV kernel (deterministic=True keeps two kernels)
    split_gradients: bool = False  # one warpgroup computes dV, the other dK, of the same keys (bwd_split_hopper.py)

    def design(self, deterministic=False):
        """How kernels/bwd_hopper.launch_bwd_hopper runs a call: "one pass", "two kernels" (dQ, then dK and dV) or
        "split gradients" (dQ, then dK and dV by a warpgroup each)."""
        if self.single_pass and not deterministic:
            return "one pass"
        return "split gradients" if self.split_gradients else "two kernels"

    def __post_init__(self):
        if self.dq is None and self.dq_hopper is None:
            raise ValueError("HopperBwdConfig needs a dQ kernel (dq or dq_hopper): deterministic=True runs it")
        if self.single_pass and self.split_gradients:
            raise ValueError("HopperBwdConfig: single_pass adds dQ from the paired warpgroups, not split_gradients")


# Keyed by (head dim, causal). scripts/bwd_split.py on the H200 (docs/results/bwd-split-v1.md, B·N = 16k, 16 heads):
# a ring of 2 stages ties 4 and beats 3. dQ (scripts/dq_sweep.py, docs/results/dq-sweep-v2-gluon.md): the Gluon
# kernel, 128x64 tiles, 2 stages, 0.386/0.699/2.366 ms causal at N = 2k/4k/16k against the best portable tiles'
# 0.473/0.851/2.928 (64x64); non-causal its 128-key tiles, 0.627/1.217/4.587 against 0.658/1.249/4.719 for 64 keys
# and the portable 0.707/1.326/5.042 (128x64, 8 warps). Causal, 128 keys were -1.5 % to +3 %: 64 kept. The
# portable tiles stay for dq_hopper=None (docs/results/dq-sweep-v1.md: the best of 13 there). single_pass where the
# one pass beat the two kernels: non-causal only (docs/results/bwd-single-pass-run39.md, section 6).
BWD_HOPPER = {
    (128, False): HopperBwdConfig(BwdConfig(64, 64, 128, 64, 8, 3, "none"), dq_hopper=HopperDqConfig(block_n=128),
                                  single_pass=True),
    (128, True): HopperBwdConfig(BwdConfig(64, 64, 64, 64, 4, 3, "none"), dq_hopper=HopperDqConfig()),
    # one pass, 3 stages: the fastest D=64 non-causal design from 4k keys, below it the portable one-launch kernel
    # (docs/perf.md, backward v7)
    (64, False): HopperBwdConfig(num_stages=3, dq_hopper=HopperDqConfig(block_n=128), single_pass=True,
                                 min_seqlen_k=4096),
    # two kernels tie the portable backward causal at every length and need no atomics (docs/perf.md, backward v7)
    (64, True): HopperBwdConfig(dq_hopper=HopperDqConfig(block_n=128), min_seqlen_k=0),
    # one warpgroup per gradient: the only tiles whose two fp32 gradients fit; 64 query rows a step beat 32 by 6-10 %
    # (docs/perf.md, backward v6); the portable kernel spills at D=256 at every length
    (256, False): HopperBwdConfig(block_n=64, dq_hopper=HopperDqConfig(block_n=32), split_gradients=True,
                                  min_seqlen_k=0),
    (256, True): HopperBwdConfig(block_n=64, dq_hopper=HopperDqConfig(block_n=32), split_gradients=True,
                                 min_seqlen_k=0),
}


# Any other CUDA GPU: conservative tiles that fit 100 KB of shared memory.
FWD_GENERIC = {
    32: TileConfig(128, 64, 4, 3),
    64: TileConfig(128, 64, 4, 3),
    128: TileConfig(128, 64, 8, 2),
    256: TileConfig(64, 32, 4, 2),
}

# float32 inputs run the exact (ieee) dot: smaller tiles keep the operands in shared memory.
FWD_FP32 = {32: TileConfig(64, 64, 4, 2), 64: TileConfig(64, 64, 4, 2), 128: TileConfig(64, 32, 4, 2),
            256: TileConfig(32, 32, 4, 1)}

# The Triton interpreter (CPU): large tiles mean fewer Python-level steps.
FWD_INTERPRETER = TileConfig(64, 64, 4, 1)


def fwd_config(head_dim_pad, causal, itemsize, arch, interpreter):
    """The forward tile config for a padded head dim, causal flag, element size and (major, minor) arch."""
    if interpreter:
        return FWD_INTERPRETER
    if itemsize == 4:
        return FWD_FP32[head_dim_pad]
    if arch == (9, 0):
        return FWD_SM90[(head_dim_pad, causal)]
    return FWD_GENERIC[head_dim_pad]


# Backward, sm90, bf16/fp16, keyed (padded head dim, causal). Chosen by
# `python -m flashtile.bench.tune --backward --seqlens 4096 16384` on 2026-11-29, best mean TFLOP/s
# (docs/results/tune-bwd-v2.md .. v5.md). D=64: dQ by the copy engine's bulk reduce-add beat per-element
# atomics by 20 % (380 vs 315) and Q-tile programs (357-371). D=128: Q-tile programs in the same launch beat
# both atomic forms (non-causal 442 vs 329 pointer, 310 bulk; causal 357), with 32-row Q tiles under the
# K/V-tile programs when nothing is masked. D=32 and D=256 were not swept.
BWD_SM90 = {
    (32, False): BwdConfig(64, 64, 64, 64, 4, 3),
    (32, True): BwdConfig(64, 64, 64, 64, 4, 3),
    (64, False): BwdConfig(64, 64, 64, 64, 4, 3),
    (64, True): BwdConfig(64, 64, 64, 64, 4, 3),
    (128, False): BwdConfig(32, 64, 64, 64, 4, 3, "none"),
    (128, True): BwdConfig(64, 64, 64, 64, 4, 3, "none"),
    (256, False): BwdConfig(32, 64, 64, 32, 4, 2),
    (256, True): BwdConfig(32, 64, 64, 32, 4, 2),
}
BWD_GENERIC = {d: BwdConfig(32, 64, 64, 32, 4, 2, "pointer") for d in (32, 64, 128, 256)}
BWD_FP32 = {d: BwdConfig(32, 32, 32, 32, 4, 1, "pointer") for d in (32, 64, 128, 256)}
BWD_INTERPRETER = BwdConfig(64, 64, 64, 64, 4, 1, "pointer")


def bwd_config(head_dim_pad, causal, itemsize, arch, interpreter):
    if interpreter:
        return BWD_INTERPRETER
    if itemsize == 4:
        return BWD_FP32[head_dim_pad]
    if arch == (9, 0):
        return BWD_SM90[(head_dim_pad, causal)]
    return BWD_GENERIC[head_dim_pad]


@dataclass(frozen=True)
class DecodeConfig:
    """The split-KV decode tiles (the query rows of a program are set by the group x new tokens)."""
    block_n: int  # keys per step
    num_warps: int
    num_stages: int
    key_groups: int = 1  # groups of block_n / key_groups keys per tile, each with its own softmax state
    heads: int = 1  # adjacent KV heads a program reads (block_n keys of each a tile), each with its own state
    max_rows: int = 128  # query rows a program takes at most: more fail to compile or overflow shared memory (sm90)


@dataclass(frozen=True)
class DecodeHopperConfig:
    """The warp-specialized Gluon decode kernel (kernels/decode_hopper.py): keys per K/V tile, ring stages, the
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


# The warp-specialized decode kernel on a head-major cache (a key-major one reads faster four KV heads a box,
# DECODE_HEADS_SM90), one split, where the (batch, KV head) programs fill their waves (of per_sm programs an SM) to
# DECODE_HOPPER_FILL. scripts/decode_ws_probe.py, B=32, 32/8 heads, D=128, bf16, paired turns, median cuDNN / candidate
# on two machines (docs/results/decode-run37.md; cuDNN 956 and 963 µs at L=32k):
#   L                            4k              32k             128k
#   64 keys, 2 stages, two an SM   - / 1.0052      1.0012 / 1.0055  1.0016 / 1.0033   (shipped under 16k keys)
#   64 keys, 3 stages, two an SM   0.9988 / 1.0007 1.0040 / 1.0066  1.0008 / 1.0029   (shipped from 16k keys)
#   64 keys, 3 stages, one an SM   1.0118 / 0.9936 1.0274 / 1.0028  1.0235 / 0.9970
#   the portable kernel            0.9983 / 0.9997 0.9983 / 0.9996  1.0004 / 1.0012
# One program an SM (two waves at B=32) gains most on the first machine and loses on the second; two an SM wins on
# both. Shorter caches lost (one an SM, call 6: 47.6 against 45.6 µs for the portable kernel at L=1k). From
# DECODE_HOPPER_LONG_FROM keys, 3 stages: on a third machine (call 14, cuDNN 935 µs) 1.0035 / 1.0010 at 32k / 128k
# against 1.0013 / 1.0001 for 2 stages; on the second (call 10) 1.0066 / 1.0029 against 1.0055 / 1.0033. At 4k 2 stages
# led (1.0052 against 1.0007).
DECODE_HOPPER = {128: DecodeHopperConfig(64, 2, 168, 128)}
DECODE_HOPPER_LONG = {128: DecodeHopperConfig(64, 3, 168, 128)}
DECODE_HOPPER_LONG_FROM = 16384
DECODE_HOPPER_FILL = 0.9
DECODE_HOPPER_MIN_KEYS = 4096

# Which decode kernel sm90 uses: "auto" (kernels/decode_hopper.py where decode_hopper_config allows, else the portable
# one) or "portable".
DECODE_BACKEND = os.environ.get("FLASHTILE_DECODE_BACKEND", "auto")


def decode_hopper_config(head_dim, pairs, capacity, num_sms):
    """The Gluon decode config for ``pairs`` (batch, KV head) programs of one split over caches of ``capacity`` keys
    (DECODE_HOPPER_LONG from DECODE_HOPPER_LONG_FROM keys), or None: at least DECODE_HOPPER_MIN_KEYS keys, and waves of
    the config's programs an SM DECODE_HOPPER_FILL full on average."""
    table = DECODE_HOPPER_LONG if capacity >= DECODE_HOPPER_LONG_FROM else DECODE_HOPPER
    config = table.get(head_dim) if DECODE_BACKEND == "auto" else None
    if config is None or capacity < DECODE_HOPPER_MIN_KEYS:
        return None
    slots = config.per_sm(head_dim) * num_sms
    return config if pairs >= DECODE_HOPPER_FILL * -(-pairs // slots) * slots else None


# Decode (split-KV): block_n keys per step; block_m is set by the query rows (group x new tokens).
# `python -m flashtile.bench.decode --sweep` on 2026-11-29 (docs/results/decode-sweep-v3.md, CUDA-graph
# times, D=128): 128 keys, 4 warps, 3 stages was best or within 3 % of the best at every shape (4.52 TB/s at
# B=8, L=128k). One such program fills an SM's shared memory, so the best split count made about one wave of
# programs: 16 splits at B=1, 2 at B=8 (B=8, L=4k: 37 µs against 44 at 8 splits), 1 at B=32 (L=4k).
# D=32/64/256 unswept.
# max_rows: the most query rows (group x new tokens, a power of two) whose tile compiles for sm90 and fits its shared
# memory, tests/test_compile_sm90.py; more rows take more row tiles a program grid (docs/perf.md, decode row tiles).
DECODE_SM90 = {32: DecodeConfig(128, 4, 3, max_rows=32), 64: DecodeConfig(128, 4, 3, max_rows=32),
               128: DecodeConfig(128, 4, 3), 256: DecodeConfig(64, 4, 3, max_rows=32)}
# One split (batch x KV heads fill the SMs, so programs come in waves): 2 stages. B=32, L=4k: 3.94 against 3.89 TB/s for
# 3 stages in `python -m flashtile.bench.decode --sweep` (docs/results/decode-sweep-v5-eager.md, eager, cuDNN 3.95 in
# the same turns), 122 against 124 µs in decode-sweep-v4's CUDA graphs; a tie at L=32k and 128k. Not where
# (configs.decode_waves) two programs an SM would end on a wave of under one program an SM: both arrangements end on
# that same tail, whose programs read faster with the deeper ring. scripts/decode_paired.py, L=32k, head-major, µs, two
# programs an SM / one (docs/results/decode-run36.md): B=40 (320 programs, a tail of 56) 1356.6 / 1230.0 and 1328.5 /
# 1278.1 on two kinds of machine (calls 5, 4); with the rule (call 6) B=34 1229.2 / 1095.9, B=48 1474.4 / 1434.0, B=80
# 2436.0 / 2374.9. Where two programs an SM end on a full or nearly full wave a tie or a loss (B=24 744.4 / 754.6, B=32
# 962.3 / 964.6, call 5), though on the slower kind one program an SM won at B=32 too (978.8 / 954.4, call 3).
DECODE_SM90_WAVES = {128: DecodeConfig(128, 4, 2)}
# From DECODE_GROUPED_FROM keys per program on, the tile's keys go in one group per warp (docs/perf.md, decode v12;
# scripts/decode_l2_probe.py, D=128, docs/results/decode-run32.md calls 5-6): B=32, L=128k 3665-3672 µs against
# 3678-3683 with one group (cuDNN 3658); B=8 and B=32 at 32k-64k keys per program a tie; below, one group is faster
# (B=32, L=4k: 132.7-133.3 against 136.9-137.6 µs; B=1, L=4k: 16.7-16.8 against 18.6-18.7), the groups' merge at the
# end costing more than their steps save.
DECODE_KEY_GROUPS, DECODE_GROUPED_FROM = 4, 32768
DECODE_GROUPED_MAX_ROWS = {32: 128, 64: 128, 128: 64, 256: 32}  # the groups' states take shared memory as rows grow
DECODE_INTERPRETER = DecodeConfig(64, 4, 1, key_groups=2)  # two groups: the CPU tests run the groups' merge
DECODE_MIN_CHUNK = 256  # keys per split at least
DECODE_MAX_SPLITS = 16  # more splits only lengthen the merge (B=1, L=32k: 37 µs at 16, 46 µs at 64)


# Several KV heads a program where a key's heads sit side by side in memory (flash-attn's contiguous (batch, seqlen,
# nheads_k, headdim) cache: one head's key is a 256-byte run, four heads' a 1 KB run). scripts/decode_l2_probe.py
# --layout key (docs/results/decode-run34.md), µs for four heads / one head a program / cuDNN handed the same cache:
# B=32, L=32k 960.4 / 972.3 / 967.9 (call 5; call 2 960.5 / 973.2 / 968.1); L=128k 3751.8 / 3832.5 / 3821.7 (3750.7 /
# 3830.4 / 3825.1); B=8, L=128k 967.2 / 970.8 / 971.3 (967.0 / 973.6 / 974.4). On call 4's faster machine a tie or
# a loss: 955.0 / 947.2 / 943.0, 3736.0 / 3730.5 / 3724.1, 962.5 / 960.0 / 947.6. With 4k keys a program a loss
# everywhere (B=8, L=32k 267.7 / 258.3 / 257.2), so from DECODE_HEADS_FROM keys a program on, with the programs
# filling nine tenths of the SMs (one program an SM: 180 KB of rings).
DECODE_HEADS_SM90 = {128: DecodeConfig(32, 4, 3, heads=4, max_rows=16)}
DECODE_HEADS_FROM = 16384


def decode_heads_config(head_dim_pad, nheads_k, rows, pairs, capacity, num_sms):
    """The several-heads config where its shape applies (the caller checks the cache: contiguous with a key's heads
    side by side, TMA-addressable, not paged), else None: one tile of query rows a head (``rows``: group x new tokens,
    at most 16), ``pairs``: (batch, KV head) programs of one head, ``capacity`` keys of cache."""
    config = DECODE_HEADS_SM90.get(head_dim_pad)
    if config is None or nheads_k % config.heads or rows > 16:
        return None
    chunk, fill = heads_programs(pairs, capacity, num_sms, config.heads)
    return config if fill and chunk >= DECODE_HEADS_FROM else None


def heads_programs(pairs, capacity, num_sms, heads):
    """With ``heads`` KV heads a program: (keys a program, whether the programs, one an SM, fill nine tenths of the SMs
    in every wave). A last wave under that runs on few SMs: B=80, L=32k, key-major, 160 programs of four heads took
    2814.9 µs against 2402.5 for one head a program (docs/results/decode-run36.md, call 7)."""
    programs = pairs // heads
    splits = decode_splits(programs, capacity, num_sms)
    tail = programs * splits % num_sms
    return capacity // splits, programs * splits >= 0.9 * num_sms and (tail == 0 or tail >= 0.9 * num_sms)


# Paged caches (block_table). A tile's keys come as one TMA box where the tile lies inside a page (its page id one
# load ahead, which costs the compiler's pipeliner a stage of the ring: hence the deeper stage counts), else by
# pointers (cp.async, rows through the page table). scripts/decode_paged_probe.py, D=128, 32/8 heads, shuffled pages
# (docs/results/decode-run35.md calls 4-10), µs, the contiguous key-major cache in brackets:
# - one head a program, pages of 256 as 128-key boxes, 5 stages: B=8, L=32k 256.9 (255.2); B=1, L=32k 49.2 (48.6);
#   pages of 64 as 64-key boxes, 7 stages: B=32, L=32k 973.1 (959.4); by pointers (pages of 16), 128 keys with 5
#   stages, B=8, L=32k: 307.4, where the contiguous cache's config took 426.8; at B=32 64 keys, 5 stages: 1026.1
#   against 1314.8. One wave of programs (B=32, L=4k): 128 keys, 3 stages (the contiguous cache's waves ring and the
#   page's stage), 135.5 (134.8) in call 8.
# - four KV heads a box (a page holds a key's heads side by side: 1 KB runs), 32 keys, 5 stages, where the
#   contiguous rule (decode_heads_config) holds: B=32, L=32k 941.1 against 951.2 for one head (937.8); L=128k
#   3673.4 against 3757.7 (3661.9); B=8, L=128k 947.5 against 951.1; below that rule a loss (B=8, L=32k 263.5
#   against 252.1). Pages under 64 keys from DECODE_PAGED_HEADS_FROM keys a program on, where the programs fill the
#   SMs: pages of 32, B=8, L=32k (4k keys a program) 265.5 against 309.0 by pointers; pages of 16 as 16-key boxes,
#   8 stages: 267.3 against 307.0, B=32, L=32k 977.2 against 1008.4. A loss with fewer keys (B=8, L=4k, 512 keys a
#   program: 62.8 against 56.1 by pointers, calls 8 and 5; B=32, L=4k, 2k: 146.4 against 146.0, calls 8 and 11) or
#   programs (B=1, 32 programs: L=32k 100.7 against 55.9, both in call 10).
DECODE_PAGED_SM90 = {(128, 128): DecodeConfig(128, 4, 5), (128, 64): DecodeConfig(64, 4, 7, max_rows=32),
                     (128, 0): DecodeConfig(128, 4, 5)}
DECODE_PAGED_SM90_WAVES = {(128, 128): DecodeConfig(128, 4, 3), (128, 64): DecodeConfig(64, 4, 7, max_rows=32),
                           (128, 0): DecodeConfig(64, 4, 5)}
DECODE_PAGED_HEADS_SM90 = {(128, 32): DecodeConfig(32, 4, 5, heads=4, max_rows=16),
                           (128, 16): DecodeConfig(16, 4, 8, heads=4, max_rows=16)}
DECODE_PAGED_HEADS_FROM = 4096


def decode_paged_config(head_dim_pad, page_size, nheads_k, rows, tma, adjacent, pairs, capacity, num_sms):
    """The paged cache's tiles (None: as the contiguous cache's). ``tma``: the pools are TMA-addressable;
    ``adjacent``: a key's KV heads sit side by side; ``rows``: query rows a head;
    ``pairs``: (batch, KV head) programs of one head. Four KV heads a box where they fit, their programs fill the
    SMs and each gets DECODE_PAGED_HEADS_FROM keys (pages under 64 keys) or DECODE_HEADS_FROM; else one head in
    boxes of 128 or 64 keys; else pointers."""
    tile = next((n for n in (32, 16) if page_size % n == 0), 0)
    heads = DECODE_PAGED_HEADS_SM90.get((head_dim_pad, tile))
    if heads and tma and adjacent and nheads_k % heads.heads == 0 and rows <= 16:
        chunk, fill = heads_programs(pairs, capacity, num_sms, heads.heads)
        if fill and chunk >= (DECODE_PAGED_HEADS_FROM if page_size < 64 else DECODE_HEADS_FROM):
            return heads
    waves = pairs >= num_sms
    tile = next((n for n in (128, 64) if tma and page_size % n == 0), 0)
    return (DECODE_PAGED_SM90_WAVES if waves else DECODE_PAGED_SM90).get((head_dim_pad, tile))


def decode_waves(pairs, num_sms):
    """Whether ``pairs`` (batch, KV head) programs of one split take DECODE_SM90_WAVES: they fill the SMs, and two
    programs an SM do not end on a tail wave of under one program an SM after full waves."""
    tail = pairs % (2 * num_sms)
    return pairs >= num_sms and not (pairs > 2 * num_sms and 0 < tail < num_sms)


def decode_splits(programs, capacity, num_sms):
    """Split count: one wave of (split, batch, KV head) programs on the SMs (one program fills an SM), within
    [1, DECODE_MAX_SPLITS] and no split under DECODE_MIN_CHUNK keys."""
    return max(1, min(num_sms // programs, DECODE_MAX_SPLITS, -(-capacity // DECODE_MIN_CHUNK)))


def decode_config(head_dim_pad, interpreter, waves=False, chunk=0):
    """The decode tiles; ``waves``: (batch, KV head) programs alone fill the SMs (one split); ``chunk``: keys per
    program."""
    if interpreter:
        return DECODE_INTERPRETER
    config = DECODE_SM90_WAVES.get(head_dim_pad, DECODE_SM90[head_dim_pad]) if waves else DECODE_SM90[head_dim_pad]
    return _grouped(head_dim_pad, config) if chunk >= DECODE_GROUPED_FROM else config


def _grouped(head_dim_pad, config):
    return replace(config, key_groups=DECODE_KEY_GROUPS, max_rows=DECODE_GROUPED_MAX_ROWS[head_dim_pad])


def decode_configs_sm90():
    """Every (padded head dim, config) decode_config or decode_heads_config can pick on sm90."""
    plain = [*DECODE_SM90.items(), *DECODE_SM90_WAVES.items()]
    return plain + [(pad, _grouped(pad, c)) for pad, c in plain] + [*DECODE_HEADS_SM90.items()]


def decode_paged_configs_sm90():
    """Every (padded head dim, keys a TMA box or 0 for pointers, config) decode_paged_config can pick on sm90."""
    return [(pad, tile, c) for table in (DECODE_PAGED_SM90, DECODE_PAGED_SM90_WAVES, DECODE_PAGED_HEADS_SM90)
            for (pad, tile), c in table.items()]
