"""The documents a user reads first stay short enough to read (issue 46): README.md is a user's guide
of at most 200 lines, docs/training.md and docs/benchmarks.md are references (what, how, figures) of
at most 600. Design history, debugging rounds and superseded figures go to docs/history.md, which
has no limit; each message says where a document's extra lines belong."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# document -> (most lines, where what does not fit belongs)
LIMITS = {
    "README.md": (200, "figure tables go to docs/benchmarks.md, reference detail to the docs/*.md it is about, "
                       "design history and debugging rounds to docs/history.md"),
    "docs/training.md": (600, "design history, measured rounds and 'we tried X, then Y' go to docs/history.md "
                              "(leave a one-line pointer where they were)"),
    "docs/benchmarks.md": (600, "superseded rows, earlier rounds and the debugging behind a figure go to "
                                "docs/history.md (\"Benchmark rounds\", under the same heading); keep the current "
                                "figures with their machine, command and shapes"),
}


def overflow(name: str, text: str) -> str | None:
    """Why `text`, the document `name`, is too long, or None when it is within its limit."""
    limit, where = LIMITS[name]
    count = len(text.splitlines())
    if count <= limit:
        return None
    return f"{name}: {count} lines, {count - limit} over its limit of {limit}; {where}"


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_document_is_within_its_line_limit(name):
    problem = overflow(name, (ROOT / name).read_text())
    assert problem is None, problem


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_document_one_line_over_its_limit_is_refused_naming_the_file_its_length_and_where_the_rest_goes(name):
    limit, _ = LIMITS[name]
    assert overflow(name, "line\n" * limit) is None
    problem = overflow(name, "line\n" * (limit + 1))
    assert problem is not None
    assert problem.startswith(f"{name}: {limit + 1} lines, 1 over its limit of {limit}; ")
    assert "docs/history.md" in problem
