"""A trace: the ordered steps of a tiled algorithm and the HBM bytes each moved."""
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Step:
    kind: str  # "load" (HBM -> SRAM), "store" (SRAM -> HBM), "compute", or "skip" (a score tile's work left out)
    tensor: str  # which tensor the tile belongs to ("" for compute)
    tile: tuple  # (row block, column block) of that tensor's tile grid
    bytes: int  # HBM bytes moved (0 for compute and skip)
    caption: str  # one sentence for a learner
    line: int  # index of the kernel line (Trace.code) this step carries out
    state: dict = field(default_factory=dict)  # running values worth showing (m, l, a row of O, ...)
    program: str = ""  # the program (or pass) the step belongs to: SRAM holds only that program's tiles
    pair: tuple = ()  # (Q tile, K/V tile) of the score tile a compute step works on or a skip step leaves out


@dataclass
class Trace:
    algo: str
    code: list  # the kernel, as numbered pseudo-code lines
    shapes: dict  # tensor -> (rows, cols) in elements
    tiles: dict  # tensor -> (row tile, col tile) sizes
    itemsize: int
    steps: list = field(default_factory=list)
    result: dict = field(default_factory=dict)  # final arrays (out, lse, ...)
    params: dict = field(default_factory=dict)  # seqlen, head_dim, block_m, block_n, causal of the run

    def begin(self, program):
        """The steps from here on belong to ``program`` (a name for a learner: "Q tile 2", "split 1")."""
        self._program = program

    def load(self, tensor, tile, rows, cols, caption, line, **state):
        self._move("load", tensor, tile, rows * cols, caption, line, state)

    def store(self, tensor, tile, rows, cols, caption, line, **state):
        self._move("store", tensor, tile, rows * cols, caption, line, state)

    def compute(self, caption, line, pair=(), **state):
        self.steps.append(Step("compute", "", (), 0, caption, line, _plain(state), self._current(), tuple(pair)))

    def skip(self, pair, caption, line):
        """The work of score tile ``pair`` (Q tile, K/V tile) is never done: the causal mask removes all of it."""
        self.steps.append(Step("skip", "", (), 0, caption, line, {}, self._current(), tuple(pair)))

    def _move(self, kind, tensor, tile, elements, caption, line, state):
        self.steps.append(Step(kind, tensor, tuple(tile), elements * self.itemsize, caption, line, _plain(state),
                               self._current()))

    def _current(self):
        return getattr(self, "_program", "")

    def bytes_read(self, tensor=None):
        return sum(s.bytes for s in self.steps if s.kind == "load" and tensor in (None, s.tensor))

    def bytes_written(self, tensor=None):
        return sum(s.bytes for s in self.steps if s.kind == "store" and tensor in (None, s.tensor))

    def counters(self):
        """{tensor: {"read": bytes, "written": bytes}} over the whole trace."""
        names = dict.fromkeys(s.tensor for s in self.steps if s.tensor)
        return {t: {"read": self.bytes_read(t), "written": self.bytes_written(t)} for t in names}

    def to_json(self):
        return dict(algo=self.algo, code=self.code, shapes=self.shapes, tiles=self.tiles, itemsize=self.itemsize,
                    steps=[asdict(s) for s in self.steps], counters=self.counters(), params=self.params)


def _plain(state):
    """Arrays to short lists of rounded floats, so a page can show them."""
    out = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            value = np.where(np.isfinite(value), np.round(value, 4), np.where(value > 0, 1e30, -1e30)).tolist()
        out[key] = value
    return out
