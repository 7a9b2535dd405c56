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
