"""The conftest under which flash-attn's own tests/test_flash_attn.py runs, unchanged, against flashtile (issue 39's
bar): ``import flash_attn`` gives flashtile's functions (flashtile.integrations.flash_attn). gpu_session.sh's
flash-attn-tests step copies it beside that file.

The file holds 413,780 cases without dropout, far more than one device call runs: ``FA_TESTS_SAMPLE=i/n`` keeps, of
each test function's cases left after -k, every n-th in collection order from the i-th (a prime n spreads the sample
over every parameter), so that calls with i = 0, 1, … cover the file in turns. The cases are then ordered by what
fixes the kernels they compile (head dim, dtype, masks): xdist hands each worker consecutive cases, which then share
kernels, rather than sixteen workers compiling the same kernel at once (``--dist worksteal`` splits the list into
consecutive parts). Sixteen workers share one GPU's memory, so each hands its cached blocks back after every case.
With ``FA_TIMES=path`` each worker appends a line per case: its seconds in all, and those spent in Triton's compile
(cache hits included), so that a call shows where its time goes (``python3 tools/fa_times.py path``).
"""
import os
import time

import pytest
import triton.compiler

import flashtile.integrations.flash_attn as shim

_COMPILE_SECONDS = [0.0]
_compile = triton.compiler.compile  # a kernel takes it at its first launch (JITFunction.create_binder)


def _timed_compile(*args, **kwargs):
    start = time.perf_counter()
    try:
        return _compile(*args, **kwargs)
    finally:
        _COMPILE_SECONDS[0] += time.perf_counter() - start


triton.compiler.compile = _timed_compile

shim.install()
_KERNEL_PARAMS = ("d", "dtype", "causal", "local", "alibi", "softcap", "deterministic", "mha_type", "kvpacked")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):  # after -k
    sample = os.environ.get("FA_TESTS_SAMPLE")
    if sample:
        start, step = map(int, sample.split("/"))
        seen, kept, dropped = {}, [], []
        for item in items:
            index = seen[item.originalname] = seen.get(item.originalname, -1) + 1
            (kept if index % step == start % step else dropped).append(item)
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    items.sort(key=_kernel_key)


def _kernel_key(item):
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return (item.originalname, ) + tuple(str(params.get(name)) for name in _KERNEL_PARAMS)


@pytest.fixture(autouse=True)
def _case_times(request):
    """FA_TIMES: the case's seconds and its compile seconds, tab-separated after its id, appended to that file."""
    path = os.environ.get("FA_TIMES")
    start, compiled = time.perf_counter(), _COMPILE_SECONDS[0]
    yield
    if path:
        with open(path, "a") as f:
            f.write(f"{request.node.nodeid}\t{time.perf_counter() - start:.3f}\t{_COMPILE_SECONDS[0] - compiled:.3f}\n")


@pytest.fixture(autouse=True)
def _free_cached_memory():
    """After each case, PyTorch's caching allocator gives its free blocks back, so that a worker's largest case does
    not hold memory the other fifteen need (run 50 lost five cases to out-of-memory that way)."""
    yield
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
