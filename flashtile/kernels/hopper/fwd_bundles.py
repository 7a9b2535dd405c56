"""What the sm90 forward (fwd.py) passes as one argument instead of many: its compile-time switches (FwdSwitches, as
fwd_launch sets them; Switches inside the kernel), the shared-memory ring with its mbarriers (Ring) and what every
partition knows of the launch (Problem) and what the consumers write (Outputs)."""
from typing import NamedTuple

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.core import _aggregate as aggregate

from .common import Views
from .fwd_schedule import tile_at, window_item, work_item


class FwdSwitches(NamedTuple):
    """A launch's compile-time switches, one constexpr argument of flash_fwd_hopper_kernel (set by
    fwd_launch.launch_args from its configs.HopperFwdConfig, the mask and the layout). Query i sees keys up to
    i + diag with MASK_RIGHT and from i + diag - left with MASK_LEFT (a sliding window: then up to i + diag + right),
    diag being Nk - Nq with BOTTOM_RIGHT, else 0."""
    MASK_RIGHT: bool
    MASK_LEFT: bool
    BOTTOM_RIGHT: bool
    IS_VARLEN: bool
    PINGPONG: bool
    OVERLAP_PV: bool
    STAGE_K: bool
    EARLY_P: bool
    STAGE_O: bool
    Q_REGS: bool
    SCHEDULE: int
    FROZEN_MAX: bool
    HAS_SINK: bool
    STAGES: int  # K/V tiles in the ring
    REGS: int  # registers per consumer thread
    SOFTCAP_SCALE: float = 0.0  # > 0: scores capped by tanh(q·k · SOFTCAP_SCALE) (qk_scale carries the cap)


@aggregate
class Switches:
    """What a launch fixes at compile time: the tiles and switches of its configs.HopperFwdConfig (launch_args), the
    mask and whether the sequences are packed."""
    HEAD_DIM_PAD: gl.constexpr  # the tiles' columns: HEAD_DIM, the tensors' head dim, rounded up to a power of two
    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr  # Q rows of a work item, WG_M to each consumer warpgroup
    BLOCK_N: gl.constexpr  # keys of a K/V tile
    STAGES: gl.constexpr  # K/V tiles in the ring
    MASK_RIGHT: gl.constexpr
    MASK_LEFT: gl.constexpr
    BOTTOM_RIGHT: gl.constexpr
    IS_VARLEN: gl.constexpr
    MAY_BE_EMPTY: gl.constexpr  # rows whose first tile has no key to see
    PINGPONG: gl.constexpr
    OVERLAP_PV: gl.constexpr
    STAGE_K: gl.constexpr
    EARLY_P: gl.constexpr
    STAGE_O: gl.constexpr
    Q_REGS: gl.constexpr
    SCHEDULE: gl.constexpr
    FROZEN_MAX: gl.constexpr
    HAS_SINK: gl.constexpr  # a learned sink logit per head (Outputs.Sinks)
    REGS: gl.constexpr
    SOFTCAP_SCALE: gl.constexpr

    @triton.constexpr_function
    def __init__(self, HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, switches):
        self.HEAD_DIM_PAD, self.HEAD_DIM, self.BLOCK_M, self.BLOCK_N = (
            gl.constexpr(x) for x in (HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N))
        for name, value in FwdSwitches(*switches)._asdict().items():
            setattr(self, name, gl.constexpr(value))
        self.MAY_BE_EMPTY = gl.constexpr(self.MASK_RIGHT.value or self.MASK_LEFT.value or self.IS_VARLEN.value)


@aggregate
class Ring:
    """The program's shared memory: each consumer's Q tile, the K/V stages and, with STAGE_O, each consumer's O tile;
    their mbarriers (Q loaded, Q free; K, V ready; K, V free once every consumer read them), the turns of ping-pong,
    k_done (STAGE_K: every consumer's last Q·Kᵀ of the item is done) and the claimed codes (SCHEDULE 3)."""
    q: gl.shared_memory_descriptor  # [NUM_WG, WG_M, HEAD_DIM_PAD]
    k: gl.shared_memory_descriptor  # [STAGES, BLOCK_N, HEAD_DIM_PAD]
    v: gl.shared_memory_descriptor
    o: gl.shared_memory_descriptor  # [NUM_WG, WG_M, HEAD_DIM_PAD] (q without STAGE_O: unused)
    q_bar: gl.shared_memory_descriptor
    q_free: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    k_free: gl.shared_memory_descriptor
    v_free: gl.shared_memory_descriptor
    code: gl.shared_memory_descriptor  # (q_bar below SCHEDULE 3: unused)
    k_done: gl.shared_memory_descriptor
    turn: gl.shared_memory_descriptor

    @triton.constexpr_function
    def __init__(self, q, k, v, o, q_bar, q_free, k_ready, v_ready, k_free, v_free, code, k_done, turn):
        self.q, self.k, self.v, self.o = q, k, v, o
        self.q_bar, self.q_free, self.k_ready, self.v_ready, self.k_free, self.v_free = (q_bar, q_free, k_ready,
                                                                                         v_ready, k_free, v_free)
        self.code, self.k_done, self.turn = code, k_done, turn


@aggregate
class Problem:
    """What every partition knows of the launch: where a head's rows sit (common.Views), the heads, the query heads
    per KV head, the Q tiles of a head and the heads of the launch, and a sliding window's sides (keys from
    i + diag - left to i + diag + right, Switches.MASK_LEFT) (integers through common.as_tensor)."""
    views: Views
    nheads: gl.tensor
    group: gl.tensor
    n_m: gl.tensor
    n_bh: gl.tensor  # batch x nheads
    right: gl.tensor
    left: gl.tensor

    @triton.constexpr_function
    def __init__(self, views, nheads, group, n_m, n_bh, right, left):
        self.views, self.nheads, self.group, self.n_m, self.n_bh = views, nheads, group, n_m, n_bh
        self.right, self.left = right, left

    @gluon.jit
    def tile(self, sw, bh, m, cu_seqlens_q, cu_seqlens_k):
        """Q tile m of head bh (batch x nheads + head): the item's first row, batch, head, first Q and K rows in the
        2-D views, lengths, diagonals and K/V tiles (see window_item)."""
        vw = self.views
        start_m, b, h, q_row, k_row, sq, sk, diag, n_tiles, n_full = tile_at(
            bh, m, self.nheads, self.group, cu_seqlens_q, cu_seqlens_k, vw.q_rows_b, vw.q_rows_h, vw.k_rows_b,
            vw.k_rows_h, vw.seqlen_q, vw.seqlen_k, sw.BLOCK_M, sw.BLOCK_N, sw.MASK_RIGHT and not sw.MASK_LEFT,
            sw.BOTTOM_RIGHT, sw.IS_VARLEN)
        return self._windowed(sw, start_m, b, h, q_row, k_row, sq, sk, diag, n_tiles, n_full)

    @gluon.jit
    def item(self, sw, w, cu_seqlens_q, cu_seqlens_k):
        """This program's w-th work item (fwd_schedule.work_item, SCHEDULE 0-2), as ``tile``."""
        bh, m = work_item(w, self.n_m, self.n_bh, self.views.seqlen_q, sw.BLOCK_M, sw.SCHEDULE)
        return self.tile(sw, bh, m, cu_seqlens_q, cu_seqlens_k)

    @gluon.jit
    def _windowed(self, sw, start_m, b, h, q_row, k_row, sq, sk, diag, n_tiles, n_full):
        """tile_at's item, with MASK_LEFT taken from its first visible K/V tile on (window_item); returns (start_m,
        b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full): the item's K/V tiles j in
        [0, n_tiles) need a mask outside [full_lo, n_full)."""
        diag_left = diag
        full_lo = 0
        if sw.MASK_LEFT:
            k_row, sk, diag, diag_left, n_tiles, full_lo, n_full = window_item(
                start_m, k_row, sk, diag + self.right, diag - self.left, sw.BLOCK_M, sw.BLOCK_N, sw.MASK_RIGHT)
        return start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full


@aggregate
class Outputs:
    """What the consumers write and scale by: O and LSE with their strides, softmax_scale · log2(e), and the heads'
    sink logits (Switches.HAS_SINK; else LSE stands in, unread)."""
    O: gl.tensor
    LSE: gl.tensor
    Sinks: gl.tensor
    stride_ob: gl.tensor
    stride_on: gl.tensor
    stride_oh: gl.tensor
    stride_lb: gl.tensor
    stride_lh: gl.tensor
    qk_scale: gl.tensor

    @triton.constexpr_function
    def __init__(self, O, LSE, Sinks, stride_ob, stride_on, stride_oh, stride_lb, stride_lh, qk_scale):
        self.O, self.LSE, self.Sinks, self.qk_scale = O, LSE, Sinks, qk_scale
        self.stride_ob, self.stride_on, self.stride_oh = stride_ob, stride_on, stride_oh
        self.stride_lb, self.stride_lh = stride_lb, stride_lh
