"""Launching a compiled kernel again without Triton's per-call work.

``kernel[grid](*args)`` binds and specializes every argument, hashes them into a cache key and wraps each
tensor descriptor, every call: tens of µs of Python, more than a small decode step takes on the GPU. A
``Replay`` is made by one such launch; it keeps the compiled kernel, the grid and the arguments in the
kernel's order, and ``run`` hands new tensors for the same places straight to the compiled kernel's
launcher. The caller keys replays by everything that fixes the other arguments and the kernel's
specialization (shapes, strides, 16-byte alignment of each pointer, constexprs).
"""
import os
from operator import is_

import torch
import triton

# The compiled kernel's launch call (CompiledKernel.run, .function, .packed_metadata) is Triton's internals:
# replay only on the version it was written against; elsewhere every call takes kernel[grid](...), as it
# does with FLASHTILE_REPLAY=0.
REPLAY_OK = triton.__version__.startswith("3.6.") and os.environ.get("FLASHTILE_REPLAY", "1") != "0"


class _Address:
    """Stands for a tensor in a cached TMA descriptor: the launcher reads only ``data_ptr()``, and holding the
    address rather than the tensor lets the caller's memory go (a descriptor is address, shape and strides)."""
    __slots__ = ("ptr", )

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def detach_descriptor(desc, tensor=None):
    """A copy of a host TensorDescriptor at ``tensor``'s address (default: its own tensor's), holding the
    address only. ``tensor`` must have the shape and strides the descriptor was made for."""
    copy = object.__new__(type(desc))
    copy.__dict__.update(desc.__dict__)
    copy.base = _Address((desc.base if tensor is None else tensor).data_ptr())
    return copy


def launch_key(tensors, *scalars):
    """A replay key: each tensor's shape, strides, dtype and address modulo 16 (Triton specializes pointers on
    16-byte alignment; None for absent tensors), the first tensor's device, and ``scalars`` (whatever else fixes
    the launch's arguments). A list comprehension: it runs on every eager call."""
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() & 15) for t in tensors]) + (
        tensors[0].device, ) + scalars


def aligned(*tensors):
    """Which pointers are 16-byte aligned (Triton specializes a kernel on it); None for absent ones."""
    return tuple(None if t is None else t.data_ptr() % 16 == 0 for t in tensors)


class Replays:
    """Replays by the caller's launch key, at most ``maxsize`` of them (then it starts over)."""

    def __init__(self, maxsize=256):
        self.replays, self.maxsize = {}, maxsize

    def get(self, key):
        return self.replays.get(key) if can_replay() else None

    def launch(self, key, device, tensors, first, found=None):
        """Replay ``key`` with ``tensors`` for its slots (Replay.launch); the first call of a key runs ``first()``,
        which launches through Triton and returns the Replay. The key must hold everything that fixes the other
        arguments and the kernel's specialization. ``found`` (a list, or None) gets the replay of the key (None where
        launches are not replayed), which a caller may launch for the same key without looking it up."""
        replay = self.get(key)
        if replay is None:
            self.put(key, first())
            replay = self.get(key)
        else:
            replay.launch(device, tensors)
        if found is not None:
            found.append(replay)

    def put(self, key, replay):
        if replay.compiled is not None and can_replay():
            if len(self.replays) >= self.maxsize:
                self.replays.clear()
            replay.prepare_raw()
            self.replays[key] = replay


class Kept:
    """What a plain call's first launch found (its replays, the config they run), kept by the call's key, so that a
    later call of that key launches it without dispatch, checks and launch keys: ops' forward and backward. A hit
    needs launches replayed and the config tables the first call read still in place (``tables``, a tuple of them,
    compared by identity: a table swapped in is another); ``maxsize`` keys, then it starts over."""

    def __init__(self, maxsize=256):
        self.items, self.maxsize = {}, maxsize

    def __len__(self):
        return len(self.items)

    def get(self, key, tables):
        item = self.items.get(key)
        return item[0] if item is not None and all(map(is_, item[1], tables)) and can_replay() else None

    def put(self, key, value, tables):
        if len(self.items) >= self.maxsize:
            self.items.clear()
        self.items[key] = (value, tables)

    def clear(self):
        self.items.clear()


class Replay:
    """One launch of ``kernel`` (made now, through Triton's usual path) and its replays. ``slots`` names the
    arguments that change from call to call (tensors); ``run`` takes new values for them, in that order.
    ``compiled`` is None where the launch cannot be replayed (the interpreter, another Triton). ``descriptors``
    holds the caller's host TMA descriptors of the first launch, detached (see detach_descriptor), if any;
    ``templates`` those of the slots, by slot, which ``launch`` aims at each call's tensors."""

    def __init__(self, kernel, grid, args, kwargs, slots):
        compiled = kernel[grid](*args, **kwargs)
        self.compiled = compiled if REPLAY_OK and hasattr(compiled, "packed_metadata") else None
        self.descriptors = None
        if self.compiled is None:
            return
        self.names = names = kernel.arg_names
        defaults = kernel.signature.parameters
        self.values = list(args) + [kwargs[n] if n in kwargs else defaults[n].default for n in names[len(args):]]
        self.slots = [names.index(s) for s in slots]
        self.templates = {k: detach_descriptor(self.values[i]) for k, i in enumerate(self.slots)
                          if hasattr(self.values[i], "block_shape")}
        for i in self.slots:  # each run brings its own; the first call's tensors may go
            self.values[i] = None
        self.grid = tuple(grid) + (1, ) * (3 - len(grid))
        self.raw = None  # set by prepare_raw once the template is final

    def pin(self, name, value):
        """Replays pass ``value`` for argument ``name`` (instead of the first launch's)."""
        self.values[self.names.index(name)] = value
        if self.raw is not None:
            self.prepare_raw()

    def prepare_raw(self):
        """Pre-expand the arguments for the C launcher under Triton's launcher object (see _RawLaunch); None
        where its shape is not the one this was written against (then run goes through compiled.run)."""
        try:
            self.raw = _RawLaunch(self.compiled, self.values, self.slots, self.templates)
        except _NotRaw:
            self.raw = None

    def launch(self, device, tensors):
        """``run`` with ``tensors``, where a slot of a descriptor takes the tensor its 2-D view starts at (the raw
        launch aims that slot's template at it only when the address is new to it)."""
        if self.templates and self.raw is None:
            tensors = [detach_descriptor(self.templates[k], t) if k in self.templates else t
                       for k, t in enumerate(tensors)]
        self.run(device, *tensors)

    def run(self, device, *tensors):
        stream = stream_handle(device)
        if self.raw is not None:
            self.raw(self.grid, stream, tensors)
            return
        values = self.values.copy()
        for i, t in zip(self.slots, tensors):
            values[i] = t
        compiled = self.compiled
        compiled.run(*self.grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *values)


class _NotRaw(Exception):
    pass


class _RawLaunch:
    """The C launch function under CompiledKernel.run, with the argument list it takes already built: Triton's
    CudaLauncher and its tensor-descriptor wrapper rebuild that list and re-encode every descriptor on each
    call; here a pinned descriptor is encoded once and a call only fills its own tensors in. A per-call
    descriptor's encoding is kept by (slot, address): the replay fixes its shape, strides and box, so a tensor back
    at an address it had before (a training loop's caching allocator) is not encoded again."""
    ENCODED_MAX = 64  # kept encodings of a launch (then it starts over)

    def __init__(self, compiled, values, slots, templates):
        from triton.backends.nvidia import driver
        self.templates = templates  # by slot: the descriptor to aim at the tensor a call hands for that slot
        launcher = compiled.run
        if (not isinstance(launcher, driver.CudaLauncher) or launcher.global_scratch_size
                or launcher.profile_scratch_size):
            raise _NotRaw
        launch = launcher.launch
        code = getattr(launch, "__code__", None)  # no descriptors: the C function itself, no Python wrapper
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ()))) if code else {}
        if cells:
            if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
                raise _NotRaw
            metas = dict(zip(sorted(cells["tensordesc_indices"]), cells["tensordesc_meta"]))
            self.launch = cells["launcher"]
        else:
            metas, self.launch = {}, launch
        self.head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                     compiled.packed_metadata, None, None, None)
        self.expand = driver.make_tensordesc_arg
        self.encoded = {}
        self.template, self.plain, self.descs = [], [], []
        for i, value in enumerate(values):
            if i in metas and i not in slots:
                self.template.extend(self.expand(value, metas[i]))
            elif i in metas:
                self.descs.append((slots.index(i), len(self.template), metas[i]))
            else:
                if i in slots:
                    self.plain.append((slots.index(i), len(self.template)))
                self.template.append(value)

    def __call__(self, grid, stream, tensors):
        args = self.template.copy()
        for k, pos in self.plain:
            args[pos] = tensors[k]
        for k, pos, meta in reversed(self.descs):  # last first: earlier positions stay put
            args[pos:pos] = self.encode(k, tensors[k], meta)
        self.launch(*grid, stream, *self.head, *args)

    def encode(self, slot, tensor, meta):
        """The launch arguments of the descriptor in ``slot`` aimed at ``tensor``, encoded once per address (the slot's
        template is copied at the tensor only for an address not encoded yet)."""
        key = (slot, tensor.data_ptr())
        encoded = self.encoded.get(key)
        if encoded is None:
            if len(self.encoded) >= self.ENCODED_MAX:
                self.encoded.clear()
            encoded = self.encoded[key] = self.expand(detach_descriptor(self.templates[slot], tensor), meta)
        return encoded


def can_replay():
    """Replays skip Triton's launch hooks, so a profiler that set them sees every launch the usual way."""
    hooks = (triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook)
    return REPLAY_OK and not any(h is not None and getattr(h, "calls", True) for h in hooks)


def stream_handle(device):
    """The current CUDA stream of ``device`` as the raw handle a launcher takes (no torch.cuda.Stream object)."""
    return triton.runtime.driver.active.get_current_stream(
        device.index if device.index is not None else torch.cuda.current_device())
