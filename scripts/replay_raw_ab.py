"""The sm90 forward replay's per-call Python on any machine (the CPU will do), in one process, taking turns: the raw
launch handed the call's tensors (each slot's template aimed only at a new address), with and without the four
descriptor copies at those tensors that every call made before the raw launch took tensors (their encodings were
kept by address then too); host_python's stand-in replay (a C launcher that does nothing, eight other tensors and
twenty integers beside). µs per call, best and median of 7 turns: ``python scripts/replay_raw_ab.py``."""
import timeit

import torch
from host_python import _FoundReplay

from flashtile.kernels.common import replay

q, k, v, o = (torch.zeros(128, 2048, dtype=torch.bfloat16) for _ in range(4))
tensors = (q, k, v, o, *(torch.zeros(4) for _ in range(8)))
found = _FoundReplay(q)


def before():
    [replay.detach_descriptor(d, t) for d, t in zip(found.descriptors, tensors)]
    found.launch(None, tensors)


def after():
    found.launch(None, tensors)


n = 50000
res = {"before": [], "after": []}
for _ in range(7):
    for name, f in (("before", before), ("after", after)):
        res[name].append(timeit.timeit(f, number=n) / n * 1e6)
for name, r in res.items():
    print(name, "best %.2f µs, median %.2f µs" % (min(r), sorted(r)[3]))
