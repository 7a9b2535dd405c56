"""Replayed launches (kernels/common/replay.py) and the once-per-signature input checks, on any machine. The
replay of a real compiled kernel runs on the GPU (the GPU tier of tests/kernels/portable/test_decode.py); here a
stand-in kernel records what its launcher would receive."""
import inspect
import os
import subprocess
import sys

import pytest
import torch
from helpers import DEVICE, randn, value_checks

import flashtile
from flashtile.kernels.common import replay


class _Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class _Kernel:
    """Stands for a JITFunction: (X, Y, n, BLOCK: constexpr, FLAG: constexpr = True)."""
    arg_names = ["X", "Y", "n", "BLOCK", "FLAG"]
    signature = inspect.signature(lambda X, Y, n, BLOCK, FLAG=True: None)

    def __init__(self):
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiled.calls.append((grid, args, kwargs))
            return self.compiled
        return launch


def test_replay_puts_each_calls_tensors_in_the_kernels_order(monkeypatch):
    monkeypatch.setattr(replay, "REPLAY_OK", True)
    monkeypatch.setattr(replay, "stream_handle", lambda device: 7)
    kernel = _Kernel()
    x0, y0, x1, y1 = (torch.zeros(1) for _ in range(4))
    r = replay.Replay(kernel, (3, 2), (x0, y0, 5), dict(BLOCK=64, num_warps=4), ["X", "Y"])
    assert kernel.compiled.calls == [((3, 2), (x0, y0, 5), dict(BLOCK=64, num_warps=4))]  # the first launch
    assert r.values == [None, None, 5, 64, True]  # the first call's tensors are not kept
    r.run(torch.device("cuda", 0), x1, y1)
    grid_and_stream, launched = kernel.compiled.calls[-1][:4], kernel.compiled.calls[-1][4:]
    assert grid_and_stream == (3, 2, 1, 7)
    assert launched[:5] == ("function", "metadata", None, None, None)
    assert launched[5] is x1 and launched[6] is y1 and launched[7:] == (5, 64, True)
    r.pin("n", 6)  # a value the caller fixes for every replay
    r.run(torch.device("cuda", 0), x0, y0)
    assert kernel.compiled.calls[-1][9:] == (x0, y0, 6, 64, True)


def test_replay_is_off_where_the_launch_returns_no_compiled_kernel():
    class Interpreted(_Kernel):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None
    args = (torch.zeros(1), torch.zeros(1), 1)
    assert replay.Replay(Interpreted(), (1, ), args, dict(BLOCK=16), ["X"]).compiled is None


def test_a_detached_descriptor_keeps_the_address_not_the_tensor():
    from triton.tools.tensor_descriptor import TensorDescriptor
    t = torch.zeros(4, 16)
    desc = TensorDescriptor(t, list(t.shape), list(t.stride()), [2, 16])
    copy = replay.detach_descriptor(desc)
    assert copy.base.data_ptr() == t.data_ptr() and not isinstance(copy.base, torch.Tensor)
    assert (copy.shape, copy.strides, copy.block_shape) == (desc.shape, desc.strides, desc.block_shape)


def test_value_checks_run_every_call_after_the_shapes_passed():
    """The shape and type checks of flash_attn_with_kvcache run once per signature; the value checks (read on
    the host) still run on every call, so a later call with lengths past the cache is refused."""
    q = randn(2, 1, 4, 32, dtype=torch.float16)
    k_cache, v_cache = (randn(2, 64, 2, 32, dtype=torch.float16) for _ in range(2))
    ok = torch.tensor([64, 10], dtype=torch.int32, device=DEVICE)
    flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=ok)
    with value_checks(), pytest.raises(ValueError, match="cache_seqlens"):
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=ok + 1)
    with pytest.raises(TypeError, match="k_cache"):  # another dtype: another signature, checked in full
        flashtile.flash_attn_with_kvcache(q, k_cache.float(), v_cache.float(), cache_seqlens=ok)


def test_flashtile_replay_0_turns_replays_off():
    code = "from flashtile.kernels.common import replay; print(replay.REPLAY_OK)"
    env = dict(os.environ, FLASHTILE_REPLAY="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_raw_launch_passes_what_tritons_own_launcher_would():
    """_RawLaunch builds the C launch arguments once; they must equal what Triton's CudaLauncher and its
    descriptor wrapper build on every call: a pinned descriptor (encoded once) and a per-call one (handed as its
    tensor)."""
    from triton.backends.nvidia import driver
    from triton.tools.tensor_descriptor import TensorDescriptor
    seen = []
    signature = {"X": "*bf16", "D": "tensordesc<bf16[64, 128]>", "E": "tensordesc<bf16[64, 128]>", "n": "i32",
                 "C": "constexpr"}
    wrapped = driver.wrap_handle_tensordesc(lambda *args: seen.append(args), signature, None)
    launcher = object.__new__(driver.CudaLauncher)
    launcher.launch, launcher.global_scratch_size, launcher.profile_scratch_size = wrapped, 0, 0
    launcher.launch_cooperative_grid, launcher.launch_pdl, launcher.num_ctas = False, False, 1
    launcher.global_scratch_align = launcher.profile_scratch_align = 1

    class Compiled:
        run, function, packed_metadata = launcher, 11, (4, 1, 0)

    t, u = torch.zeros(64, 128, dtype=torch.bfloat16), torch.ones(64, 128, dtype=torch.bfloat16)
    pinned = replay.detach_descriptor(TensorDescriptor(t, [64, 128], [128, 1], [64, 128]))
    per_call = TensorDescriptor(u, [64, 128], [128, 1], [64, 128])
    values = [None, pinned, None, 7, 64]  # X and E come with each call
    raw = replay._RawLaunch(Compiled, values, [0, 2], {1: replay.detach_descriptor(per_call)})
    raw((3, 1, 1), 5, (t, u))  # E's slot takes the tensor its template is aimed at
    by_raw = seen.pop()
    launcher(3, 1, 1, 5, 11, (4, 1, 0), None, None, None, t, pinned, per_call, 7, 64)
    by_triton = seen.pop()
    assert len(by_raw) == len(by_triton)
    # (a descriptor's base goes as its address: the C launcher reads data_ptr() only)
    assert all(a is b or (a.data_ptr() == b.data_ptr() if hasattr(a, "data_ptr") else a == b)
               for a, b in zip(by_raw, by_triton))


def test_raw_launch_encodes_a_descriptor_once_per_address():
    """A tensor handed for a descriptor's slot: the slot's template is aimed at it (shape, strides and box kept) and
    encoded the first time its address comes; back at an address it had before, the kept encoding is used, and the
    launch arguments stay those of a fresh encoding. Past ENCODED_MAX addresses the kept encodings start over."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    seen, encodings = [], []

    def expand(desc, meta):
        encodings.append((desc.base.data_ptr(), desc.block_shape))
        return [("encoded", desc.base.data_ptr(), meta)]

    tensors = [torch.zeros(64, 128, dtype=torch.bfloat16) for _ in range(3)]
    template = replay.detach_descriptor(TensorDescriptor(tensors[0], [64, 128], [128, 1], [32, 128]))
    raw = object.__new__(replay._RawLaunch)
    raw.head, raw.launch, raw.expand, raw.encoded = (), lambda *args: seen.append(args), expand, {}
    raw.template, raw.plain, raw.descs, raw.templates = [7], [], [(0, 0, "meta")], {0: template}
    for t in (tensors[0], tensors[1], tensors[0], tensors[2], tensors[1]):
        raw((1, 1, 1), 5, (t, ))
        assert seen.pop() == (1, 1, 1, 5, ("encoded", t.data_ptr(), "meta"), 7)
    assert encodings == [(t.data_ptr(), [32, 128]) for t in tensors]
    raw.ENCODED_MAX = 3
    for t in (torch.zeros(64, 128, dtype=torch.bfloat16), tensors[0]):  # a fourth address: the three kept go
        raw((1, 1, 1), 5, (t, ))
        assert encodings[-1][0] == t.data_ptr()
    assert len(encodings) == 5 and len(raw.encoded) == 2


def test_raw_launch_of_a_kernel_without_descriptors():
    """Without descriptors CudaLauncher.launch is the C function itself (no code object): the raw launch must
    call it with the plain argument list (functools.partial stands in for the builtin here)."""
    import functools

    from triton.backends.nvidia import driver
    seen = []
    launcher = object.__new__(driver.CudaLauncher)
    launcher.launch = functools.partial(lambda *args: seen.append(args))
    launcher.global_scratch_size = launcher.profile_scratch_size = 0
    launcher.launch_cooperative_grid, launcher.launch_pdl, launcher.num_ctas = False, False, 1
    launcher.global_scratch_align = launcher.profile_scratch_align = 1

    class Compiled:
        run, function, packed_metadata = launcher, 11, (4, 1, 0)

    t, u = torch.zeros(4), torch.ones(4)
    raw = replay._RawLaunch(Compiled, [None, 3, None], [0, 2], {})
    raw((2, 1, 1), 5, (t, u))
    by_raw = seen.pop()
    launcher(2, 1, 1, 5, 11, (4, 1, 0), None, None, None, t, 3, u)
    by_triton = seen.pop()
    assert len(by_raw) == len(by_triton)
    assert all(a is b or a == b for a, b in zip(by_raw, by_triton))


def test_replays_launch_runs_first_once_and_aims_descriptors_at_each_calls_tensors(monkeypatch):
    """Replays.launch: a key's first call launches through ``first``; later ones replay it, and a slot that held a
    TMA descriptor gets a copy of it at the new tensor's address (shape, strides and box kept)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    monkeypatch.setattr(replay, "REPLAY_OK", True)
    monkeypatch.setattr(replay, "stream_handle", lambda device: 7)
    monkeypatch.setattr(replay.triton.knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(replay.triton.knobs.runtime, "launch_exit_hook", None)
    kernel, firsts = _Kernel(), []
    x0, y0, x1, y1 = (torch.zeros(4, 16) for _ in range(4))

    def first():
        firsts.append(1)
        desc = TensorDescriptor(x0, list(x0.shape), list(x0.stride()), [2, 16])
        return replay.Replay(kernel, (1, ), (desc, y0, 3), dict(BLOCK=16), ["X", "Y"])
    replays = replay.Replays()
    monkeypatch.setattr(replay.Replay, "prepare_raw", lambda self: None)  # the stand-in has no C launcher
    found = []
    replays.launch("key", torch.device("cuda", 0), (x0, y0), first, found)
    replays.launch("key", torch.device("cuda", 0), (x1, y1), first, found)
    assert firsts == [1]
    launched = kernel.compiled.calls[-1][9:]
    assert launched[0].base.data_ptr() == x1.data_ptr() and launched[0].block_shape == [2, 16]
    assert launched[1] is y1 and launched[2:] == (3, 16, True)
    assert found[0] is found[1] is replays.get("key")  # ``found``: the key's replay, for a caller to launch again
    found[0].launch(torch.device("cuda", 0), (x0, y1))
    launched = kernel.compiled.calls[-1][9:]
    assert launched[0].base.data_ptr() == x0.data_ptr() and launched[1] is y1
    monkeypatch.setattr(replay, "REPLAY_OK", False)  # replays off: the key's first call finds none
    replays.launch("other", torch.device("cuda", 0), (x0, y0), first, found)
    assert found[2] is None


def test_launch_key_tells_apart_what_specializes_a_kernel():
    a = torch.zeros(4, 16)
    assert replay.launch_key((a, None), 1.0) == replay.launch_key((torch.zeros(4, 16), None), 1.0)
    assert replay.launch_key((a, None), 1.0) != replay.launch_key((a.t(), None), 1.0)  # strides
    assert replay.launch_key((a, None), 1.0) != replay.launch_key((a.half(), None), 1.0)  # dtype
    misaligned = torch.zeros(65)[1:].view(4, 16)  # the same shape, 4 bytes past an aligned address
    assert replay.launch_key((a, None), 1.0) != replay.launch_key((misaligned, None), 1.0)
    assert replay.launch_key((a, None), 1.0) != replay.launch_key((a, a), 1.0)
    assert replay.launch_key((a, None), 1.0) != replay.launch_key((a, None), 2.0)
