"""kernels/common/online_softmax.py's host side: which tanh a capped launch takes."""
from unittest import mock

import torch

from flashtile.kernels.common import online_softmax


def test_softcap_mode_takes_the_tanh_instruction_on_cuda_gpus_from_sm75():
    """0 without a cap; on a CUDA GPU from sm75 on 2 (tanh.approx.f32, as the sm90 kernels, so that a forward and a
    backward of different kernels compute the same scores), before it 1; under the interpreter 1 (no PTX)."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert online_softmax.softcap_mode(cpu, 0.0) == online_softmax.softcap_mode(cuda, 0.0) == 0
    with mock.patch.object(online_softmax, "interpreter_enabled", lambda: False):
        for capability, mode in (((9, 0), 2), ((8, 0), 2), ((7, 5), 2), ((7, 0), 1)):
            with mock.patch.object(torch.cuda, "get_device_capability", lambda device, c=capability: c):
                assert online_softmax.softcap_mode(cuda, 50.0) == mode, capability
        assert online_softmax.softcap_mode(cpu, 50.0) == 1
    with mock.patch.object(online_softmax, "interpreter_enabled", lambda: True):
        assert online_softmax.softcap_mode(cuda, 50.0) == 1
