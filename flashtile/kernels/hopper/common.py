"""What the sm90 Gluon kernels share: the register layouts of wgmma results and register operands, the 2-D
(rows, row stride) views that every tensor is read through (and Views, the bundle that tells a partition where a
head's rows sit), and TMA descriptors over them with the copies that read and write tiles through them.

A head's rows of one sequence are ``row_base + n`` of a view at column ``col``: view_layout finds the view of a
token-major (.., seqlen, nheads, headdim) or head-major (batch, nheads, seqlen, headdim) tensor, or of packed
(total, nheads, headdim) sequences, and says how rows and columns move per batch and per head.

A head dim that is not a power of two (96, 192, 40, ...) runs in tiles of the next one (HEAD_DIM_PAD; the tensors'
own is HEAD_DIM): its descriptor reads a 3-D (rows, heads, head dim) view, whose columns past the head dim the TMA
unit fills with zeros on loads and leaves alone on stores; there a view's ``col`` counts heads, not columns.
"""
import functools

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

from ..common.tiles import is_causal, next_pow2, windowed

# Gluon is experimental and its API moves between releases (3.9 renamed the TMA copies): these kernels are
# written, tested and measured against triton 3.6; other versions use the portable kernel.
GLUON_VERSION_OK = triton.__version__.startswith("3.6.")


@triton.constexpr_function
def wgmma_layout(n):
    """Registers of one warpgroup's wgmma result with n columns (the four warps stacked along the rows)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@triton.constexpr_function
def register_operand_layout(result_layout):
    """A 16-bit A operand held in registers, for a wgmma whose result has ``result_layout``."""
    return gl.DotOperandLayout(operand_index=0, parent=result_layout, k_width=2)


@triton.constexpr_function
def row_run_layout(n):
    """A warpgroup's [64, n] tile with each thread holding runs of 8 columns of a row (16-byte stores, whole
    32-byte sectors per quad of lanes): the wgmma result layout with two lane bits and two register bits swapped
    (columns 2, 4 against 8, 16). Values move only within quads, but triton 3.6 converts through shared
    memory (scratch per consumer warpgroup): the backwards convert after their loops, the forward only where its
    ring leaves room (D=64)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]] + [[0, c] for c in (32, 64, 128) if c < n],
        lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
        shape=[64, n])


@aggregate
class Views:
    """Where a head's rows sit in the 2-D views (view_layout): Q's and K's rows per batch and per head and the head's
    first column, and the sequence lengths (integers through as_tensor)."""
    q_rows_b: gl.tensor
    q_rows_h: gl.tensor
    q_col_h: gl.tensor
    k_rows_b: gl.tensor
    k_rows_h: gl.tensor
    k_col_h: gl.tensor
    seqlen_q: gl.tensor
    seqlen_k: gl.tensor

    @triton.constexpr_function
    def __init__(self, q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k):
        self.q_rows_b, self.q_rows_h, self.q_col_h = q_rows_b, q_rows_h, q_col_h
        self.k_rows_b, self.k_rows_h, self.k_col_h = k_rows_b, k_rows_h, k_col_h
        self.seqlen_q, self.seqlen_k = seqlen_q, seqlen_k


@gluon.jit
def views(q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k):
    """A kernel's integer arguments as Views."""
    return Views(as_tensor(q_rows_b), as_tensor(q_rows_h), as_tensor(q_col_h), as_tensor(k_rows_b),
                 as_tensor(k_rows_h), as_tensor(k_col_h), as_tensor(seqlen_q), as_tensor(seqlen_k))


@gluon.jit
def sequence_rows(b, q_row, k_row, seqlen_q, seqlen_k, cu_seqlens_q, cu_seqlens_k, IS_VARLEN: gl.constexpr):
    """Sequence b's first rows in the Q and K 2-D views and its lengths: the batch-mode values given, or, packed, from
    cu_seqlens."""
    if IS_VARLEN:
        q_row = gl.load(cu_seqlens_q + b)
        k_row = gl.load(cu_seqlens_k + b)
        seqlen_q = gl.load(cu_seqlens_q + b + 1) - q_row
        seqlen_k = gl.load(cu_seqlens_k + b + 1) - k_row
    return q_row, k_row, seqlen_q, seqlen_k


@gluon.jit
def as_tensor(x):
    """An integer kernel argument as a tensor: one equal to 1 (or unused) arrives as a constant, which an aggregate's
    tensor field does not take."""
    return gl.to_tensor(x)


@gluon.jit
def store_rows(acc, Out, b, h, start, seqlen, stride_b, stride_n, stride_h, layout: gl.constexpr,
               HEAD_DIM: gl.constexpr):
    """A [rows, HEAD_DIM_PAD] tile of a backward's dK, dV or dQ into rows start.. of Out (batch b, head h) in Out's
    dtype, stored from ``layout`` (the tile is converted to it first, after the cast: row_run_layout for 16-byte runs
    of a row, or the tile's own), rows past seqlen and columns past HEAD_DIM left alone (32-bit offsets from a 64-bit
    base: a tile of 64-bit pointers would take a register each)."""
    acc = gl.convert_layout(acc.to(Out.dtype.element_ty), layout)
    rows = gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    base = Out + b.to(gl.int64) * stride_b + h.to(gl.int64) * stride_h + start.to(gl.int64) * stride_n
    gl.store(base + rows[:, None] * stride_n + cols[None, :], acc, mask=tile_mask(start + rows < seqlen, cols,
                                                                                  HEAD_DIM))


@gluon.jit
def tile_mask(rows_ok, cols, HEAD_DIM: gl.constexpr):
    """The mask of a tile's stores and pointer loads: the rows ``rows_ok`` keeps ([rows, 1]), and where the tile is
    wider than the head (HEAD_DIM < HEAD_DIM_PAD) only its columns < HEAD_DIM ([rows, HEAD_DIM_PAD])."""
    mask = rows_ok[:, None]
    if HEAD_DIM < cols.shape[0]:
        mask = mask & (cols < HEAD_DIM)[None, :]
    return mask


@builtin
def tma_load(desc, row, col, bar, smem, _semantic=None):
    """TMA copy of the tile at (``row``, ``col``) of ``desc``'s view into ``smem`` (a [rows, HEAD_DIM_PAD] tile),
    completing on ``bar``; through a 3-D view (tile_descriptor) ``col`` is the head."""
    smem, coord = _tile_coord(desc, row, col, smem, _semantic)
    tma.async_copy_global_to_shared(desc, coord, bar, smem, _semantic=_semantic)


@builtin
def tma_store(desc, row, col, smem, _semantic=None):
    """tma_load's way back: the tile in ``smem`` to (``row``, ``col``) of ``desc``'s view (tma.store_wait completes
    it)."""
    smem, coord = _tile_coord(desc, row, col, smem, _semantic)
    tma.async_copy_shared_to_global(desc, coord, smem, _semantic=_semantic)


def _tile_coord(desc, row, col, smem, _semantic):
    """The box's coordinates and ``smem`` seen as the box (a 3-D view's is [rows, 1, HEAD_DIM_PAD])."""
    shape = desc.block_type.shape
    if len(shape) == 2:
        return smem, [row, col]
    return smem._reinterpret(desc.dtype, shape, desc.layout, _semantic=_semantic), [row, col, 0]


@builtin
def allocate_tiles(desc, count, _semantic=None):
    """Shared memory for ``count`` tiles of ``desc``'s box, [count, rows, HEAD_DIM_PAD] (None: one, [rows,
    HEAD_DIM_PAD]), in the layout of a 2-D box of that shape (a 3-D view's box, [rows, 1, HEAD_DIM_PAD], is laid out
    alike)."""
    rows, cols = desc.block_type.shape[0], desc.block_type.shape[-1]
    count = gl._unwrap_if_constexpr(count)
    return gl.allocate_shared_memory(desc.dtype, [rows, cols] if count is None else [count, rows, cols],
                                     smem_layout(rows, cols, desc.dtype), _semantic=_semantic)


def window_sides(window_size, rows_q, rows_k):
    """(MASK_RIGHT, MASK_LEFT, right, left) of a call: query i sees keys up to i + diag (+ right) and, with MASK_LEFT,
    from i + diag - left (diag: the kernel's alignment, a sequence's own when packed). A window has both sides in the
    kernel: one open to the left takes a left side no row reaches (rows_q, rows_k: at least any sequence's lengths)."""
    if not windowed(window_size):
        return is_causal(window_size), False, 0, 0
    left, right = window_size
    return right >= 0, True, max(right, 0), left if left >= 0 else max(rows_q, rows_k)


def view_layout(t, varlen):
    """((rows, width, row stride), rows per batch, rows per head, column per head) of the 2-D view a descriptor
    reads, from token-major (.., seqlen, nheads, headdim) or head-major (batch, nheads, seqlen, headdim) strides; a
    row may be longer than the view's width (q, k, v sliced out of one packed qkv, rows of 16-byte multiples); None
    for any other."""
    return _layout_of(t.shape, t.stride(), varlen)


@functools.lru_cache(maxsize=1024)
def _layout_of(shape, stride, varlen):
    head_dim = shape[-1]
    if stride[-1] != 1:
        return None
    if varlen:
        s_n, s_h = stride[0], stride[1]
        if s_h != head_dim or s_n < shape[1] * head_dim or s_n % 8:
            return None
        return (shape[0], shape[1] * head_dim, s_n), 0, 0, head_dim
    s_b, s_n, s_h = stride[0], stride[1], stride[2]
    batch, seqlen, nheads = shape[:3]
    if s_h == head_dim and s_n >= nheads * head_dim and s_n % 8 == 0 and s_b == seqlen * s_n:
        return (batch * seqlen, nheads * head_dim, s_n), seqlen, 0, head_dim
    if s_n >= head_dim and s_n % 8 == 0 and s_h == seqlen * s_n and s_b == nheads * s_h:
        return (batch * nheads * seqlen, head_dim, s_n), nheads * seqlen, seqlen, 0
    return None


def same_rows(a, b):
    """Whether two view_layouts address a head's rows alike (the same row and column offsets serve both; their row
    strides may differ, each descriptor has its own)."""
    return a is not None and b is not None and a[0][:2] == b[0][:2] and a[1:] == b[1:]


def view(t, shape):
    """The 2-D (rows, width) view of ``t``, rows ``row stride`` apart, that view_layout found."""
    rows, width, row_stride = shape
    return t.as_strided((rows, width), (row_stride, 1))


def tile_descriptor(t, layout, block, dtype):
    """A TMA descriptor over ``t``'s view ``layout`` (view_layout's), in boxes of ``block`` rows and
    tile_cols(head dim) columns: the 2-D view where the two widths agree, else a 3-D (rows, heads, head dim) view (one
    head-major: (rows, 1, head dim)), whose box [block, 1, tile_cols] reads zeros past the head dim."""
    (rows, width, row_stride), cols, head_dim = layout[0], next_pow2(t.shape[-1]), t.shape[-1]
    if cols == head_dim:
        return descriptor(view(t, layout[0]), [block, cols], smem_layout(block, cols, dtype))
    view3 = t.as_strided((rows, width // head_dim if layout[3] else 1, head_dim), (row_stride, head_dim, 1))
    return descriptor(view3, [block, 1, cols], gl.NVMMASharedLayout.get_default_for([block, 1, cols], dtype))


# The columns of the kernels' tiles for a head dim (HEAD_DIM_PAD; the head's own is HEAD_DIM): its next power of two.
# For the kernels; host code calls next_pow2 itself (a constexpr function's call costs over a microsecond).
tile_cols = triton.constexpr_function(next_pow2)


def head_coord(layout, head_dim):
    """A view_layout's (rows per batch, rows per head, column per head) as the kernels' coordinates count them: a
    head's columns in a 2-D view, the head itself (1, or 0 head-major) in tile_descriptor's 3-D view."""
    _, rows_b, rows_h, col_h = layout
    return rows_b, rows_h, col_h if next_pow2(head_dim) == head_dim else int(col_h > 0)


def descriptor(t, block_shape, layout):
    """A TMA descriptor of a 2-D view that the kernel's ``supports`` already checked (the constructor's validation is
    host time on every call)."""
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides = t, list(t.shape), list(t.stride())
    desc.block_shape, desc.layout, desc.padding = block_shape, layout, "zero"
    return desc


@functools.lru_cache(maxsize=None)
def smem_layout(block, head_dim, dtype):
    return gl.NVMMASharedLayout.get_default_for([block, head_dim], dtype)
