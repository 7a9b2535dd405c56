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


def fill_template(template, **values):
    """The text of a template beside this file with each {{KEY}} replaced by its value; {{FOOTER}} is footer.html (the
    error line, the page's data as the constant NAME, its script)."""
    html = (_HERE / template).read_text().replace("{{FOOTER}}", (_HERE / "footer.html").read_text())
    for key, value in values.items():
        html = html.replace("{{" + key + "}}", value)
    return html


def script_json(data):
    """data as JSON that can sit inside a <script> element."""
    return json.dumps(data).replace("</", "<\\/")


NAMES = dict(naive="Naive attention", softmax="Online softmax", fa1="FlashAttention-1", fa2="FlashAttention-2",
             fa2_bwd="FlashAttention-2 backward", decode="Flash decoding")
INTROS = dict(
    naive="Three passes through HBM: the N×N scores S are written, read back for the softmax, the probabilities P "
          "written and read again for P·V. Watch the S and P counters: they grow with N², the cost FlashAttention "
          "removes.",
    softmax="The softmax of each row in two passes over its tiles: the first keeps a running maximum m and a "
            "denominator d (a larger maximum rescales d), the second writes the normalized values. Watch x read "
            "twice and y written once.",
    fa1="K/V tiles in the outer loop stay on chip while every Q tile streams past; each Q tile's O, m and l go back "
        "to HBM after every K/V tile. Watch O's read and write counters grow once per outer step: the traffic "
        "FlashAttention-2 removes.",
    fa2="Each program owns one Q tile and keeps m, l and its output acc in registers while the K/V tiles stream "
        "past; O and LSE are written once, at the end. Watch Q read once and O written once; causal programs skip "
        "the K/V tiles wholly in their future.",
    fa2_bwd="A preprocess writes D = rowsum(dO ∘ O); then each program owns one K/V tile, keeps dK and dV in "
            "registers, and loops over the Q tiles that see it, recomputing P from the forward's LSE instead of "
            "storing it. dQ is added in HBM by every program: watch its read and write counters.",
    decode="One query against a long KV cache: the cache is split so that many programs read it at once; each "
           "writes a partial output and its log-sum-exp, and the combine merges them exactly by LSE.")


def title(trace):
    """The page's heading: the algorithm and the parameters it ran with."""
    p = trace.params
    parts = [f"N={p['seqlen']}", f"D={p['head_dim']}", f"tiles {p['block_m']}×{p['block_n']}"] if p else []
    if p.get("causal"):
        parts.append("causal")
    return " · ".join(["flashtile", NAMES.get(trace.algo, trace.algo)] + ([", ".join(parts)] if parts else []))


def render(trace):
    """The step-through page of one trace, as an HTML string."""
    return fill_template("page.html", NAME="TRACE", TITLE=title(trace), INTRO=INTROS.get(trace.algo, ""),
                         STYLE=(_HERE / "style.css").read_text(), DATA=script_json(trace.to_json()),
                         SCRIPT=(_HERE / "page.js").read_text())


def playground(seqlen=6, head_dim=4, seed=0):
    """The interactive attention playground, as an HTML string."""
    rng = np.random.default_rng(seed)
    data = {name: np.round(rng.standard_normal((seqlen, head_dim)), 2).tolist() for name in ("Q", "K", "V")}
    return fill_template("playground.html", NAME="DATA", STYLE=(_HERE / "style.css").read_text(),
                         DATA=script_json(data), SCRIPT=(_HERE / "playground.js").read_text())
