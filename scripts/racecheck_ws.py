"""What compute-sanitizer's racecheck reports on warp-specialized Gluon kernels (run on the device).

    compute-sanitizer --tool racecheck python3 scripts/racecheck_ws.py minimal|scratch|uneven|mbarrier|fwd|bwd|decode

``minimal``: a Gluon kernel with two partitions that share nothing (each writes its own global elements): no shared
memory of ours, no mbarrier. Whatever racecheck reports there comes from Triton's warp-specialization runtime: the
default warpgroup writes each warp's partition index (and at the end an exit code) into bytes at the top of shared
memory, and the worker warps read them, ordered by ``barrier.sync 1`` (a named barrier of every thread).
``scratch``: the same, each partition (4 warps) passing a tile through a layout conversion, whose shared-memory
scratch is ordered by a named barrier of that partition's 128 threads (``bar.sync id, 128``); ``uneven``: the default
partition through seven conversions, the worker through one, so that they pass unequal numbers of such barriers;
``mbarrier``: as ``minimal``, the default partition waiting on an mbarrier that the worker arrives on.
``fwd``, ``bwd``, ``decode``: the warp-specialized kernels (kernels/hopper/fwd.py, bwd_dq.py and bwd.py,
decode.py) on small problems, to compare their reports with the minimal ones.
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _write(out, index: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, 32, layout=layout)
    gl.store(out + index * 32 + offs, gl.full([32], index + 1, gl.int32, layout))


@gluon.jit
def _transpose(out, index: gl.constexpr, REPEAT: gl.constexpr):
    """A [64, 64] tile through REPEAT layout conversions: shared-memory scratch of this partition's own, ordered by a
    named barrier of its warps (bar.sync id, 128), as every convert_layout in the attention kernels is."""
    rows: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    cols: gl.constexpr = gl.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, rows))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, rows))
    tile = r[:, None] * 64 + c[None, :] + index * 4096  # [64, 64]
    for _ in gl.static_range(REPEAT):
        tile = gl.convert_layout(gl.convert_layout(tile, cols), rows)
    tile = gl.convert_layout(tile, cols)
    r2 = gl.arange(0, 64, layout=gl.SliceLayout(1, cols))
    c2 = gl.arange(0, 64, layout=gl.SliceLayout(0, cols))
    gl.store(out + index * 4096 + r2[:, None] * 64 + c2[None, :], tile)


@gluon.jit
def _wait_then_write(out, bar):
    mbarrier.wait(bar, 0)
    _write(out, 0)


@gluon.jit
def _write_then_arrive(out, bar):
    _write(out, 1)
    mbarrier.arrive(bar)


@gluon.jit
def two_partitions_kernel(out, KIND: gl.constexpr):
    """KIND 0: each partition writes its own elements; 1: each through one layout conversion of its own; 2: the
    default partition through seven, the worker through one (unequal numbers of partition barriers); 3: as 0, the
    default waiting on an mbarrier the worker arrives on."""
    if KIND == 3:
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        gl.warp_specialize([(_wait_then_write, (out, bar)), (_write_then_arrive, (out, bar))], [1], [24])
        mbarrier.invalidate(bar)
    elif KIND == 0:
        gl.warp_specialize([(_write, (out, 0)), (_write, (out, 1))], [1], [24])
    elif KIND == 1:
        gl.warp_specialize([(_transpose, (out, 0, 0)), (_transpose, (out, 1, 0))], [4], [24])
    else:
        gl.warp_specialize([(_transpose, (out, 0, 3)), (_transpose, (out, 1, 0))], [4], [24])


def minimal(kind):
    size = 2 * 4096 if kind in (1, 2) else 64
    out = torch.zeros(size, dtype=torch.int32, device="cuda")
    two_partitions_kernel[(4, )](out, kind, num_warps=4)
    torch.cuda.synchronize()
    assert out.tolist() == (list(range(size)) if kind in (1, 2) else [1] * 32 + [2] * 32)
    print(f"minimal kind {kind}: the partitions wrote what they should")


def fwd():
    import flashtile
    from flashtile import dispatch
    q, k, v = (torch.randn(1, 512, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert dispatch.hopper_forward_config(q, k, v, (-1, -1)) is not None
    out = flashtile.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    print("fwd: O finite", bool(out.isfinite().all()))


def bwd():
    """The sm90 dQ and dK/dV Gluon kernels (kernels/hopper/bwd_dq.py, bwd.py)."""
    import flashtile
    from flashtile import dispatch
    q, k, v = (torch.randn(1, 2048, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    assert dispatch.takes_hopper_backward(q, k, v, q, (-1, -1), False)
    flashtile.flash_attn_func(q, k, v).backward(torch.randn_like(q))
    torch.cuda.synchronize()
    print("bwd: dQ finite", bool(q.grad.isfinite().all()))


def decode():
    """The sm90 decode kernel (kernels/hopper/decode.py): 30 x 8 programs over a head-major cache of 4096 keys."""
    import flashtile
    q = torch.randn(30, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(30, 8, 4096, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    out = flashtile.flash_attn_with_kvcache(q, k, v)
    torch.cuda.synchronize()
    print("decode: O finite", bool(out.isfinite().all()))


if __name__ == "__main__":
    {"minimal": lambda: minimal(0), "scratch": lambda: minimal(1), "uneven": lambda: minimal(2),
     "mbarrier": lambda: minimal(3),
     "fwd": fwd,
     "bwd": bwd, "decode": decode}[sys.argv[1]]()
