"""kernels/portable/packed.py: the rows of packed tensors that no sequence owns."""
import pytest
import torch
from helpers import DEVICE

from flashtile.kernels.portable.packed import launch_zero_unused_grads


def _filled(*shape):
    return torch.full(shape, 7.0, dtype=torch.float16, device=DEVICE)


@pytest.mark.parametrize("ends", [(9, 12), (0, 17), (13, 0), (13, 17)], ids=["inside", "no-q-rows", "no-k-rows",
                                                                            "all-used"])
def test_zero_unused_grads_zeroes_only_the_rows_past_each_last_sequence(ends):
    """dq's rows from cu_seqlens_q[-1] on and dk's, dv's from cu_seqlens_k[-1] on become 0, every other element is
    left as it was: GQA (dk, dv with fewer heads), dk and dv slices of one packed buffer (rows longer than their
    heads), more rows than one program's."""
    end_q, end_k = ends
    cu_q = torch.tensor([0, min(5, end_q), end_q], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, min(3, end_k), end_k], dtype=torch.int32, device=DEVICE)
    dq = _filled(13, 4, 24)
    dk, dv = _filled(17, 2, 2, 24).unbind(1)
    launch_zero_unused_grads(dq, dk, dv, cu_q, cu_k)
    for grad, end in ((dq, end_q), (dk, end_k), (dv, end_k)):
        assert torch.equal(grad[end:], torch.zeros_like(grad[end:]))
        assert torch.equal(grad[:end], torch.full_like(grad[:end], 7.0))


def test_zero_unused_grads_names_a_tensor_whose_heads_are_apart():
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    dq = _filled(8, 2, 16)
    spread = _filled(8, 2, 32)[..., :16]  # each head's 16 columns, 32 apart
    with pytest.raises(ValueError, match="dv must have its"):
        launch_zero_unused_grads(dq, dq, spread, cu, cu)
