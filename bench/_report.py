"""Writing a bench's results into docs/benchmarks.md: the one helper every `--write` uses.

    from _report import write_section           # bench/ is on sys.path when a bench runs
    write_section("## Gateway\n\n...")                       # a whole "## " section
    write_section("### Rollout overlap\n\n...", under="## Training")   # one part of a section

The text's first line is its heading.  A section of that heading is replaced (up to the
next heading of the same or a higher level), or added: a "## " section at the end of the
file, a "### " part at the end of its `under` section (or right under that section's
heading with `first=True`); a missing `under` section is added at the end.  Everything
else in the file is kept as it is.  Headings inside ``` code fences are not headings.
The file is replaced atomically, so a crash never leaves half a document.
"""
from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def _level(line: str) -> int:
    """1-6 for a markdown heading line, else 0."""
    stripped = line.lstrip("#")
    hashes = len(line) - len(stripped)
    return hashes if 1 <= hashes <= 6 and stripped.startswith(" ") else 0


def _headings(lines: list[str]) -> list[tuple[int, int]]:
    """(line index, level) of every heading outside code fences."""
    found, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and _level(line):
            found.append((i, _level(line)))
    return found


def _span(lines: list[str], title: str, lo: int = 0, hi: int | None = None) -> tuple[int, int] | None:
    """[start, end) of the section headed `title` within lines[lo:hi], or None."""
    hi = len(lines) if hi is None else hi
    heads = [(i, lvl) for i, lvl in _headings(lines) if lo <= i < hi]
    for n, (i, lvl) in enumerate(heads):
        if lines[i].rstrip() == title:
            end = next((j for j, other in heads[n + 1:] if other <= lvl), hi)
            return i, end
    return None


def _block(text: str) -> list[str]:
    return text.strip("\n").splitlines() + [""]


def _trim(lines: list[str]) -> list[str]:
    """Drop trailing blank lines."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def splice(doc: str, text: str, *, under: str | None = None, first: bool = False) -> str:
    """`doc` with the section `text` (its first line the heading) replaced or added; see the module doc."""
    title = text.strip("\n").splitlines()[0].rstrip() if text.strip() else ""
    if not _level(title):
        raise ValueError(f"write_section: the text must start with a markdown heading, got {title[:60]!r}")
    if under is not None and _level(under) >= _level(title):
        raise ValueError(f"write_section: {title!r} must be a deeper heading than under={under!r}")
    lines = doc.splitlines() or ["# Benchmarks"]
    lo, hi = 0, len(lines)
    if under is not None:
        parent = _span(lines, under.rstrip())
        if parent is None:
            lines = _trim(lines) + ["", under.rstrip(), ""]
            parent = (len(lines) - 2, len(lines))
        lo, hi = parent
    found = _span(lines, title, lo + (under is not None), hi)
    if found is not None:
        start, end = found
    elif under is not None and first:
        start = end = lo + 1
        while start < hi and not lines[start].strip():
            start = end = start + 1
    else:
        start = end = hi
    before = _trim(lines[:start])
    after = lines[end:]
    while after and not after[0].strip():
        after = after[1:]
    out = before + [""] + _block(text) + after
    return "\n".join(_trim(out)) + "\n"


def write_section(text: str, *, under: str | None = None, first: bool = False,
                  path: str | Path = BENCHMARKS) -> Path:
    """Replace (or add) the section `text` in docs/benchmarks.md; see the module doc."""
    path = Path(path)
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    new = splice(doc, text, under=under, first=first)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as handle:
        handle.write(new)
    os.replace(tmp, path)
    return path


def machine(extra: str = "") -> str:
    """'2-core CPU, 24 GiB (Python 3.11.7, ...)': this machine, for a 'Machine:' line."""
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        memory = f", {gib:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    versions = ", ".join(v for v in (f"Python {platform.python_version()}", extra) if v)
    return f"{os.cpu_count()}-core CPU{memory} ({versions})"


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]
