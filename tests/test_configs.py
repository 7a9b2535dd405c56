"""flashtile/configs.py holds data: keyword-only entries, each table linked to the measurements that chose it."""
import dataclasses
import re
from pathlib import Path

import pytest

from flashtile import configs

ROOT = Path(__file__).resolve().parent.parent
SOURCE = (ROOT / "flashtile" / "configs.py").read_text()
CLASSES = [configs.TileConfig, configs.BwdConfig, configs.HopperFwdConfig, configs.HopperDqConfig,
           configs.HopperBwdConfig, configs.DecodeConfig, configs.DecodeHopperConfig]


def _anchors(markdown):
    """GitHub's anchors of a markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_entries_are_keyword_only(cls):
    """Every field by name: a positional value is refused even where it would fill a required field."""
    required = [f for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    with pytest.raises(TypeError, match="positional"):
        cls(*[64] * max(len(required), 1))


def test_from_fields_builds_in_field_order():
    assert configs.from_fields(configs.TileConfig, (128, 64, 8, 2)) == configs.TileConfig(
        block_m=128, block_n=64, num_warps=8, num_stages=2)


def test_the_file_is_data_not_a_run_log():
    lines = [line.strip() for line in SOURCE.splitlines() if line.strip()]
    comments = sum(line.startswith("#") for line in lines)
    assert comments < (len(lines) - comments) / 4, "the story goes to docs/configs.md"
    history = [line for line in lines if re.search(r"\b(run|call)s? \d+|docs/results/|\d+(\.\d+)? ?(µs|TFLOP)", line)]
    assert not history, history


def test_every_link_names_a_section_of_docs_configs():
    anchors = _anchors((ROOT / "docs" / "configs.md").read_text())
    links = re.findall(r"docs/configs\.md(#[\w\-]+)((?:, #[\w\-]+)*)", SOURCE)
    assert len(links) >= 10
    for first, more in links:
        for anchor in [first] + re.findall(r"#[\w\-]+", more):
            assert anchor[1:] in anchors, anchor
    tables = re.findall(r"^([A-Z][A-Z0-9_]+) = \{", SOURCE, re.M)
    assert {"FWD_HOPPER", "BWD_HOPPER", "FWD_SM90", "BWD_SM90", "DECODE_SM90"} <= set(tables)
