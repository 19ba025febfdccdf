"""bench/_report.py: the one writer of docs/benchmarks.md sections (every bench's --write)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _report import splice, write_section  # noqa: E402

DOC = """# Benchmarks

Intro.

## Sandbox

old sandbox

## Scale-out

### Weight sync (CPU)

old sync

### GPU

```
# a comment, not a heading
## nor this
```
gpu text

## Retrieval

retrieval text
"""


def test_a_section_is_replaced_in_place_and_the_others_kept():
    out = splice(DOC, "## Sandbox\n\nnew sandbox\n| a | b |")
    assert "old sandbox" not in out and "new sandbox\n| a | b |\n\n## Scale-out" in out
    assert out.replace("new sandbox\n| a | b |", "old sandbox") == DOC


def test_a_new_section_goes_to_the_end():
    out = splice(DOC, "## Training\n\nnumbers")
    assert out == DOC + "\n## Training\n\nnumbers\n"


def test_a_part_is_replaced_inside_its_section_only():
    out = splice(DOC, "### GPU\n\nnew gpu", under="## Scale-out")
    assert "gpu text" not in out and "## nor this" not in out       # the fence belonged to the old part
    assert out.endswith("### GPU\n\nnew gpu\n\n## Retrieval\n\nretrieval text\n")
    assert "old sync" in out and "old sandbox" in out


def test_a_new_part_goes_to_the_end_of_its_section_or_first():
    last = splice(DOC, "### CPU again\n\nx", under="## Scale-out")
    assert "gpu text\n\n### CPU again\n\nx\n\n## Retrieval" in last
    first = splice(DOC, "### New\n\ny", under="## Scale-out", first=True)
    assert "## Scale-out\n\n### New\n\ny\n\n### Weight sync (CPU)" in first


def test_a_missing_parent_section_is_added_with_the_part():
    out = splice(DOC, "### Rollout overlap\n\nz", under="## Training")
    assert out == DOC + "\n## Training\n\n### Rollout overlap\n\nz\n"
    again = splice(out, "### GRPO step vs TRL\n\nw", under="## Training")
    assert again == out + "\n### GRPO step vs TRL\n\nw\n"
    assert splice(again, "### Rollout overlap\n\nz", under="## Training") == again   # idempotent


def test_text_without_a_heading_or_a_shallower_part_is_refused():
    with pytest.raises(ValueError, match="must start with a markdown heading"):
        splice(DOC, "no heading")
    with pytest.raises(ValueError, match="deeper heading"):
        splice(DOC, "## Two", under="## Scale-out")


def test_write_section_creates_and_rewrites_the_file(tmp_path):
    path = tmp_path / "benchmarks.md"
    write_section("## Gateway\n\nfirst", path=path)
    assert path.read_text() == "# Benchmarks\n\n## Gateway\n\nfirst\n"
    write_section("## Gateway\n\nsecond", path=path)
    assert path.read_text() == "# Benchmarks\n\n## Gateway\n\nsecond\n"
    assert [p.name for p in tmp_path.iterdir()] == ["benchmarks.md"]      # no temporary file left
