"""The sm90 forward's host side (kernels/hopper/fwd.py is the kernel): whether it covers a call, its grid and
arguments, and the launch, replayed after a launch key's first call (kernels/common/replay.py)."""
import torch
from triton.experimental.gluon import language as gl

from ..common.online_softmax import score_scales
from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import cdiv, is_causal, next_pow2, num_sms, windowed
from .common import (
    GLUON_VERSION_OK,
    head_coord,
    same_rows,
    tile_descriptor,
    view,
    view_layout,
    window_sides,
)
from .fwd import flash_fwd_hopper_kernel
from .fwd_bundles import FwdSwitches
from .fwd_schedule import WG_M, counter_size, is_stream_counter, stream_counter, uses_claims, uses_frozen_max


def supports(q, k, v, window_size):
    """Whether this kernel covers the call (given a config for its head dim): triton 3.6, bf16/fp16, full or causal
    attention or a sliding window, 16-byte aligned tensors in strides a 2-D view can read (V's rows addressed like K's:
    the kernel reads both at the same coordinates), a head dim of 16-byte rows."""
    varlen = q.dim() == 3
    return (GLUON_VERSION_OK and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] % 8 == 0
            and all(t.data_ptr() % 16 == 0 for t in (q, k, v))
            and view_layout(q, varlen) is not None and same_rows(view_layout(v, varlen), view_layout(k, varlen)))


_REPLAYS = Replays()


def launch_fwd_hopper(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
                      bottom_right, config, sinks=None, found=None, softcap=0.0):
    """As ``fwd.launch_fwd``, for calls ``supports`` accepts: ``window_size`` flash-attn's (left, right), -1 for
    unbounded ((-1, 0): causal); ``config`` a configs.HopperFwdConfig; ``sinks`` (float32 (nheads,) or None) a learned
    sink logit per head; ``softcap`` > 0 caps the scores at ±softcap by tanh (flash-attn's softcap). The first
    call of a launch key goes through Triton; later ones replay it (kernels/common/replay.py) with descriptors of this
    call's tensors. ``found`` (a list, or None) gets (the key's replay, its counter), which launch_again launches for a
    later call of the same key without its lookups (nothing where launches are not replayed)."""
    size = counter_size(config, is_causal(window_size), q, cu_seqlens_q, max_seqlen_q, windowed(window_size))
    counter = stream_counter(q.device, size) if size else None
    key = launch_key((q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, counter, sinks), max_seqlen_q, softmax_scale,
                     window_size, bottom_right, config, None if counter is None else counter.data_ptr(),  # pinned
                     softcap)
    replay = _REPLAYS.get(key)
    if replay is None:
        grid, args, kwargs = launch_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                                         window_size, bottom_right, config, counter, sinks, softcap)
        replay = Replay(flash_fwd_hopper_kernel, grid, args, kwargs,
                        ["q_desc", "k_desc", "v_desc", "o_desc", "O", "LSE", "Sinks", "Qp", "Kp", "Vp",
                         "cu_seqlens_q", "cu_seqlens_k"])
        if replay.compiled is not None:
            replay.stage_o = kwargs["SWITCHES"].STAGE_O
        _REPLAYS.put(key, replay)
        replay = _REPLAYS.get(key)
    else:
        _launch(replay, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks)
    if found is not None and replay is not None:
        found.append((replay, counter))


def launch_again(kept, q, k, v, out, lse, sinks=None):
    """Launch ``kept`` (what launch_fwd_hopper's ``found`` got, for a batch-mode call of the same launch key) with this
    call's tensors; False, launching nothing, where the current stream's counter is not the one its replay holds."""
    replay, counter = kept
    if counter is not None and not is_stream_counter(q.device, counter):
        return False
    _launch(replay, q, k, v, out, lse, None, None, sinks)
    return True


def _launch(replay, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks):
    """A replay with this call's tensors in its slots (without STAGE_O o_desc, unused, is q's)."""
    replay.launch(q.device, (q, k, v, out if replay.stage_o else q, out, lse, lse if sinks is None else sinks, q, k, v,
                             cu_seqlens_q, cu_seqlens_k))


def switches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: tuple[int, int], config: object,
             softcap: float = 0.0) -> FwdSwitches:
    """The compile-time switches a batch-mode launch of ``config`` on tensors shaped like q, k, v takes, from
    launch_args on new tensors of the call's shapes, on q's device (``flashtile info`` prints them)."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
    return launch_args(q, k, v, out, lse, None, None, None, q.shape[-1] ** -0.5, window_size, True, config,
                       softcap=softcap)[2]["SWITCHES"]


def launch_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
                bottom_right, config, counter=None, sinks=None, softcap=0.0):
    """(grid, args, kwargs) of the kernel launch (tools/compile_sm90.py compiles from them without a GPU).
    ``counter``: zeroed int32 (counter_size of them) the SCHEDULE 3 programs claim items from and FROZEN_MAX queues
    failed rows in (None: not needed, or a new one); ``sinks``: float32 (nheads,) sink logits, or None;
    ``window_size``, ``softcap``: as launch_fwd_hopper's."""
    varlen, causal = cu_seqlens_q is not None, is_causal(window_size)
    nheads, nheads_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    q_layout, k_layout, v_layout = view_layout(q, varlen), view_layout(k, varlen), view_layout(v, varlen)
    (q_rows_b, q_rows_h, q_col_h), (k_rows_b, k_rows_h, k_col_h) = head_coord(q_layout, head_dim), head_coord(
        k_layout, head_dim)
    q2, k2, v2 = view(q, q_layout[0]), view(k, k_layout[0]), view(v, v_layout[0])  # (the FROZEN_MAX redo's pointers)
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    # O by TMA stores where its 2-D view maps rows as Q's does (the same row and column offsets serve both)
    o_layout = view_layout(out, varlen)
    stage_o = bool(config.o_tma and out.data_ptr() % 16 == 0 and same_rows(o_layout, q_layout))
    descs = [tile_descriptor(t, layout, block, dtype)
             for t, layout, block in ((q, q_layout, WG_M.value), (k, k_layout, config.block_n),
                                      (v, v_layout, config.block_n),
                                      (out, o_layout, WG_M.value) if stage_o else (q, q_layout, WG_M.value))]
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, 0
        o_strides = (0, out.stride(0), out.stride(1))
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        o_strides = (out.stride(0), out.stride(1), out.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    n_m = cdiv(seqlen_q, config.block_m)
    persistent = config.persistent and seqlen_q <= config.persistent_max_seqlen
    # (single tiles need two of them: with one, the compiler folds a consumer's rows past Nq = 1 and crashes)
    schedule = (2 if persistent and not causal and n_m > 1 else 1) if config.balanced else 0
    n_bh, n_half, sms = batch * nheads, cdiv(n_m, 2), num_sms(q.device)
    n_work = n_bh * (n_m if schedule == 2 else n_half)  # Q tiles, or pairs of them (see work_item)
    tail_heads = 1
    if uses_claims(config, causal, varlen, seqlen_q):
        schedule, tail_heads = 3, min(n_bh, cdiv(config.claims * sms, n_half))  # the tail: claims rounds of pairs
        n_work = (n_bh - tail_heads) * n_half + tail_heads * n_m  # (see lpt_item)
    grid = (min(n_work, sms) if persistent else n_work, )
    frozen = uses_frozen_max(config, q.dtype, windowed(window_size))
    if (schedule == 3 or frozen) and counter is None:
        counter = torch.zeros(counter_size(config, causal, q, cu_seqlens_q, max_seqlen_q, windowed(window_size)),
                              dtype=torch.int32, device=q.device)
    mask_right, mask_left, right, left = window_sides(window_size, q.shape[-3], k.shape[-3])
    qk_scale, softcap_scale, _ = score_scales(softmax_scale, softcap)
    args = (*descs, out, lse, lse if sinks is None else sinks, q2, k2, v2, q2.stride(0), k2.stride(0), v2.stride(0),
            cu_seqlens_q, cu_seqlens_k, counter if schedule == 3 or frozen else None, tail_heads, q_rows_b,
            q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, *o_strides, *lse_strides, seqlen_q, seqlen_k, nheads,
            nheads // nheads_k, n_m, n_bh, qk_scale, right, left)
    switches = FwdSwitches(
        MASK_RIGHT=mask_right, MASK_LEFT=mask_left, BOTTOM_RIGHT=bottom_right, IS_VARLEN=varlen,
        PINGPONG=config.pingpong, OVERLAP_PV=config.overlap_pv,
        STAGE_K=bool(config.o_kstage and next_pow2(head_dim) > 64 and config.block_m == 2 * WG_M.value
                     and not stage_o),
        STAGE_O=stage_o, EARLY_P=config.early_p, Q_REGS=config.q_regs, SCHEDULE=schedule, FROZEN_MAX=frozen,
        HAS_SINK=sinks is not None, STAGES=config.num_stages, REGS=config.consumer_regs, SOFTCAP_SCALE=softcap_scale)
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, SWITCHES=switches, num_warps=4, maxnreg=config.maxnreg)
    return grid, args, kwargs
