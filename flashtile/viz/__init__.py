"""Self-contained HTML pages (no network, no CDN) drawn from a trace, and the attention playground.

``render(trace)`` lays out HBM and SRAM with the tiles of every tensor, a step list with play / pause /
step / scrub, each step's caption and kernel line, and live HBM read/write counters per tensor.
``playground()`` is a small attention on real numbers: click a score, follow it through its softmax row
into O; toggle the causal mask.
"""
import json
from pathlib import Path

import numpy as np

_HERE = Path(__file__).parent


def _fill(template, **values):
    html = (_HERE / template).read_text()
    for key, value in values.items():
        html = html.replace("{{" + key + "}}", value)
    return html


def _json(data):
    return json.dumps(data).replace("</", "<\\/")


def render(trace):
    """The step-through page of one trace, as an HTML string."""
    data = trace.to_json()
    title = f"flashtile · {trace.algo} · N={trace.shapes.get('K', trace.shapes.get('x'))[0]}"
    return _fill("page.html", TITLE=title, STYLE=(_HERE / "style.css").read_text(), DATA=_json(data),
                 SCRIPT=(_HERE / "page.js").read_text())


def playground(seqlen=6, head_dim=4, seed=0):
    """The interactive attention playground, as an HTML string."""
    rng = np.random.default_rng(seed)
    data = {name: np.round(rng.standard_normal((seqlen, head_dim)), 2).tolist() for name in ("Q", "K", "V")}
    return _fill("playground.html", STYLE=(_HERE / "style.css").read_text(), DATA=_json(data),
                 SCRIPT=(_HERE / "playground.js").read_text())
