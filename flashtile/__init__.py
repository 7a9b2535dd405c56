"""flashtile: exact attention (FlashAttention) for PyTorch, written in Python with Triton.

Names load on first use, so ``flashtile.cli`` can pick the Triton interpreter before triton loads.
"""
import importlib

_PUBLIC = {
    "flash_attn_func": "api",
    "flash_attn_varlen_func": "api",
    "flash_attn_qkvpacked_func": "api",
    "flash_attn_kvpacked_func": "api",
    "flash_attn_varlen_qkvpacked_func": "api",
    "flash_attn_varlen_kvpacked_func": "api",
    "scaled_dot_product_attention": "api",
    "flash_attn_with_kvcache": "api",
    "combine": "api",
    "unpad_input": "integrations.flash_attn",
    "pad_input": "integrations.flash_attn",
    "set_value_checks": "checks",
}
_MODULES = ("reference", "lessons", "trace", "viz", "sdpa", "distributed")  # reachable as flashtile.reference etc.
__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'flashtile' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function (about 10 µs per call)
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
