"""The sm90 forward replay's per-call Python on any machine (the CPU will do), in one process, taking turns: four
descriptors copied at the call's tensors and handed to the raw launch (as before the raw launch took tensors), against
the tensors handed to it (each slot's template aimed only at a new address); the C launcher a no-op, eight other
tensors and twenty integers beside. µs per call, best and median of 7 turns: ``python scripts/replay_raw_ab.py``."""
import timeit

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from flashtile.kernels.common import replay

q, k, v, o = (torch.zeros(128, 2048, dtype=torch.bfloat16) for _ in range(4))
plain = [torch.zeros(4) for _ in range(8)]
templates = [replay.detach_descriptor(TensorDescriptor(t, list(t.shape), list(t.stride()), [128, 128]))
             for t in (q, k, v, o)]
raw = object.__new__(replay._RawLaunch)
raw.head, raw.launch, raw.expand, raw.encoded = (), lambda *a: None, lambda d, m: [d, 1, 2], {}
raw.template, raw.plain = [0] * 28, [(4 + i, i) for i in range(8)]
raw.descs, raw.templates = [(j, 8, None) for j in range(4)], dict(enumerate(templates))


def before():
    descs = (replay.detach_descriptor(d, t) for d, t in zip(templates, (q, k, v, o)))
    raw((1, 1, 1), 0, (*descs, *plain))


def after():
    raw((1, 1, 1), 0, (q, k, v, o, *plain))


n = 50000
res = {"before": [], "after": []}
for _ in range(7):
    for name, f in (("before", before), ("after", after)):
        res[name].append(timeit.timeit(f, number=n) / n * 1e6)
for name, r in res.items():
    print(name, "best %.2f µs, median %.2f µs" % (min(r), sorted(r)[3]))
