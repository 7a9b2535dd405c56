"""kernels/hopper/common.py on any machine: the 2-D views the sm90 kernels' descriptors read address exactly the
rows of each (batch, head) and each packed sequence, and views a descriptor cannot read are refused."""
import pytest
import torch

from flashtile.kernels.hopper import common as hopper_common


def _rows(view, row_base, col, n, head_dim):
    return view[row_base:row_base + n, col:col + head_dim]


@pytest.mark.parametrize("layout", ["tokens-major", "heads-major"])
def test_view_addresses_each_head(layout):
    batch, seqlen, nheads, head_dim = 3, 5, 4, 8
    if layout == "tokens-major":
        t = torch.randn(batch, seqlen, nheads, head_dim)
    else:
        t = torch.randn(batch, nheads, seqlen, head_dim).transpose(1, 2)
    layout, rows_b, rows_h, col_h = hopper_common.view_layout(t, varlen=False)
    view = hopper_common.view(t, layout)
    assert view.data_ptr() == t.data_ptr() and view.stride(-1) == 1
    for b in range(batch):
        for h in range(nheads):
            got = _rows(view, b * rows_b + h * rows_h, h * col_h, seqlen, head_dim)
            assert torch.equal(got, t[b, :, h])


def test_view_addresses_each_packed_sequence():
    seqlens, nheads, head_dim = [2, 0, 5], 3, 16
    t = torch.randn(sum(seqlens), nheads, head_dim)
    layout, _, _, col_h = hopper_common.view_layout(t, varlen=True)
    view = hopper_common.view(t, layout)
    start = 0
    for n in seqlens:
        for h in range(nheads):
            assert torch.equal(_rows(view, start, h * col_h, n, head_dim), t[start:start + n, h])
        start += n


def test_views_the_kernel_cannot_read():
    qkv = torch.randn(2, 7, 3, 4, 64)  # q, k, v interleaved: a head's rows are not evenly spaced in a view
    assert hopper_common.view_layout(qkv[:, :, 0], varlen=False) is None
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64)[..., :32],
                                     varlen=False) is None  # a slice of the head dim
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64).transpose(-1, -2), varlen=False) is None
