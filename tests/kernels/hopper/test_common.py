"""kernels/hopper/common.py on any machine: the 2-D views the sm90 kernels' descriptors read address exactly the
rows of each (batch, head) and each packed sequence, and views a descriptor cannot read are refused."""
import pytest
import torch

from flashtile.kernels.hopper import common as hopper_common


def _rows(view, row_base, col, n, head_dim):
    return view[row_base:row_base + n, col:col + head_dim]


def _strided(layout, batch, seqlen, nheads, head_dim):
    if layout == "tokens-major":
        return torch.randn(batch, seqlen, nheads, head_dim)
    if layout == "heads-major":
        return torch.randn(batch, nheads, seqlen, head_dim).transpose(1, 2)
    if layout == "qkv-packed":  # k of flash_attn_qkvpacked_func's (batch, seqlen, 3, nheads, headdim)
        return torch.randn(batch, seqlen, 3, nheads, head_dim)[:, :, 1]
    return torch.randn(batch, nheads, seqlen, head_dim + 8)[..., :head_dim].transpose(1, 2)  # rows padded


@pytest.mark.parametrize("layout", ["tokens-major", "heads-major", "qkv-packed", "heads-major-padded-rows"])
def test_view_addresses_each_head(layout):
    batch, seqlen, nheads, head_dim = 3, 5, 4, 8
    t = _strided(layout, batch, seqlen, nheads, head_dim)
    layout, rows_b, rows_h, col_h = hopper_common.view_layout(t, varlen=False)
    view = hopper_common.view(t, layout)
    assert view.data_ptr() == t.data_ptr() and view.stride(-1) == 1
    for b in range(batch):
        for h in range(nheads):
            got = _rows(view, b * rows_b + h * rows_h, h * col_h, seqlen, head_dim)
            assert torch.equal(got, t[b, :, h])


def test_packed_slices_share_rows_with_a_contiguous_tensor():
    """q, k, v sliced out of one qkv are addressed like a contiguous tensor of their shape (the backward reads dO at
    Q's coordinates), with their own row stride."""
    qkv = torch.randn(2, 7, 3, 4, 64)
    dout = torch.randn(2, 7, 4, 64)
    packed, plain = hopper_common.view_layout(qkv[:, :, 0], False), hopper_common.view_layout(dout, False)
    assert hopper_common.same_rows(packed, plain) and packed != plain
    assert not hopper_common.same_rows(plain, hopper_common.view_layout(dout.transpose(1, 2).contiguous()
                                                                        .transpose(1, 2), False))


@pytest.mark.parametrize("packed", [False, True], ids=["contiguous", "qkv-packed"])
def test_view_addresses_each_packed_sequence(packed):
    seqlens, nheads, head_dim = [2, 0, 5], 3, 16
    t = torch.randn(sum(seqlens), 3, nheads, head_dim)[:, 2] if packed else torch.randn(sum(seqlens), nheads, head_dim)
    layout, _, _, col_h = hopper_common.view_layout(t, varlen=True)
    view = hopper_common.view(t, layout)
    start = 0
    for n in seqlens:
        for h in range(nheads):
            assert torch.equal(_rows(view, start, h * col_h, n, head_dim), t[start:start + n, h])
        start += n


def test_views_the_kernel_cannot_read():
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64)[..., :32],
                                     varlen=False) is None  # a slice of the head dim
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64).transpose(-1, -2), varlen=False) is None
    rows_of_72_bytes = torch.randn(2, 7, 36)[..., :32].unflatten(-1, (4, 8))  # a descriptor's rows are 16-byte steps
    assert hopper_common.view_layout(rows_of_72_bytes, varlen=False) is None
    assert hopper_common.view_layout(torch.randn(2, 4, 7, 64).transpose(1, 2)[:, ::2], varlen=False) is None


@pytest.mark.parametrize("head_dim", [40, 96, 192])
@pytest.mark.parametrize("layout", ["tokens-major", "heads-major", "qkv-packed", "heads-major-padded-rows"])
def test_a_padded_head_dim_is_read_through_heads_rows_and_columns(layout, head_dim):
    """A head dim below its tile's (96 in tiles of 128): the descriptor's 3-D view (rows, heads, head dim) holds each
    (batch, head)'s rows at [row_base + n, col, :head dim] with col the head (0 head-major), so that a box of the
    tile's width reads zeros past the head, not its neighbour's columns; its box is [rows, 1, tile columns]."""
    from triton.experimental.gluon import language as gl
    batch, seqlen, nheads = 3, 5, 4
    t = _strided(layout, batch, seqlen, nheads, head_dim).to(torch.bfloat16)
    layout = hopper_common.view_layout(t, varlen=False)
    rows_b, rows_h, col_h = hopper_common.head_coord(layout, head_dim)
    desc = hopper_common.tile_descriptor(t, layout, 64, gl.bfloat16)
    view = desc.base
    cols = hopper_common.tile_cols(head_dim)
    assert view.data_ptr() == t.data_ptr() and view.dim() == 3
    assert desc.block_shape == [64, 1, cols] and cols > head_dim
    assert all(s * 2 % 16 == 0 for s in view.stride()[:2]) and view.stride(-1) == 1  # TMA: 16-byte strides
    assert view.stride(0) >= view.stride(1) * view.shape[1]  # strides ordered as the dims
    for b in range(batch):
        for h in range(nheads):
            got = view[b * rows_b + h * rows_h:b * rows_b + h * rows_h + seqlen, h * col_h]
            assert torch.equal(got, t[b, :, h])


def test_a_padded_head_dim_of_packed_sequences():
    seqlens, nheads, head_dim = [2, 0, 5], 3, 80
    t = torch.randn(sum(seqlens), nheads, head_dim, dtype=torch.float16)
    layout = hopper_common.view_layout(t, varlen=True)
    _, _, col_h = hopper_common.head_coord(layout, head_dim)
    from triton.experimental.gluon import language as gl
    view = hopper_common.tile_descriptor(t, layout, 64, gl.float16).base
    for h in range(nheads):
        assert torch.equal(view[:sum(seqlens), h * col_h], t[:, h])


def test_a_power_of_two_head_dim_keeps_its_2d_view():
    from triton.experimental.gluon import language as gl
    t = torch.randn(2, 5, 4, 128, dtype=torch.bfloat16)
    layout = hopper_common.view_layout(t, varlen=False)
    desc = hopper_common.tile_descriptor(t, layout, 64, gl.bfloat16)
    assert desc.block_shape == [64, 128] and desc.base.shape == (10, 512)
    assert hopper_common.head_coord(layout, 128) == layout[1:]
