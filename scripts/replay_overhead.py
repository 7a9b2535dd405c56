"""Host time of the raw replay (kernels/common/replay.py, _RawLaunch) against Triton's own CudaLauncher path, for a
decode-like argument list (two pinned descriptors, ~50 arguments) and a stand-in C launch function; runs on
any machine (the descriptors take Triton's unencoded path here, so the GPU's per-call encoding is not in it).

    python scripts/replay_overhead.py
"""

import torch
from triton.backends.nvidia import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from flashtile.bench.__main__ import host_ms
from flashtile.kernels.common import replay

INTS, CONSTEXPRS = 40, 14


def per_call_us(fn, calls=50000):
    """Host µs a call, the Python alone (the bench's host_ms, no synchronization)."""
    return host_ms(fn, lambda: None, calls, warmup=1000) * 1e3


def main():
    signature = {"Q": "*bf16", "K": "tensordesc<bf16[128, 128]>", "V": "tensordesc<bf16[128, 128]>",
                 **{f"i{j}": "i32" for j in range(INTS)}, **{f"C{j}": "constexpr" for j in range(CONSTEXPRS)}}
    launcher = object.__new__(driver.CudaLauncher)
    launcher.launch = driver.wrap_handle_tensordesc(lambda *args: None, signature, None)
    launcher.global_scratch_size = launcher.profile_scratch_size = 0
    launcher.global_scratch_align = launcher.profile_scratch_align = 1
    launcher.launch_cooperative_grid, launcher.launch_pdl, launcher.num_ctas = False, False, 1

    class Compiled:
        run, function, packed_metadata = launcher, 11, (4, 1, 0)

    q = torch.zeros(64, 128, dtype=torch.bfloat16)
    desc = replay.detach_descriptor(TensorDescriptor(q, [64, 128], [128, 1], [64, 128]))
    values = [None, desc, desc] + list(range(INTS)) + [1] * CONSTEXPRS
    raw = replay._RawLaunch(Compiled, values, [0])

    def through_triton():
        args = values.copy()
        args[0] = q
        launcher(3, 1, 1, 5, 11, (4, 1, 0), None, None, None, *args)

    print(f"Triton's launcher path {per_call_us(through_triton):.2f} us, "
          f"raw replay {per_call_us(lambda: raw((3, 1, 1), 5, (q, ))):.2f} us")


if __name__ == "__main__":
    main()
