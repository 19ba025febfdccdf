"""The README's commands as a user types them: every flag a README command line passes is one its
script's parser accepts, and the catalog check prints what the README shows."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def bash_lines() -> list[str]:
    """The README's ```bash blocks, one entry per command (backslash continuations joined)."""
    lines, block = [], False
    for raw in README.read_text().splitlines():
        if raw.startswith("```"):
            block = raw.strip() == "```bash"
            continue
        if block:
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + raw.strip()
            else:
                lines.append(raw.strip())
    return lines


def python_commands() -> list[tuple[str, list[str]]]:
    """(the script or -m module, the flags the line passes) for each `python ...` line."""
    out = []
    for line in bash_lines():
        if not line.startswith("python "):
            continue
        words = shlex.split(line, comments=True)
        words = words[:words.index("--")] if "--" in words else words    # after it: another runner's flags
        target = f"-m {words[2]}" if words[1] == "-m" else words[1]
        flags = [w.split("=")[0] for w in words[2:] if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
        out.append((target, flags))
    return out


@cache
def help_text(target: str) -> str:
    cmd = [sys.executable, *target.split()] if target.startswith("-m ") else [sys.executable, str(ROOT / target)]
    done = subprocess.run([*cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, f"`{target} --help` failed: {done.stderr[-2000:]}"
    return done.stdout


COMMANDS = python_commands()


def test_the_readme_has_the_commands_this_test_reads():
    targets = {t for t, _ in COMMANDS}
    assert {"evaluation/run_hle.py", "training/train.py", "-m retrieval.server", "-m orchestrator.catalog"} <= targets
    assert sum(len(f) for _, f in COMMANDS) > 40


@pytest.mark.parametrize("target", sorted({t for t, flags in COMMANDS if flags}))
def test_every_flag_a_readme_command_passes_is_one_its_parser_accepts(target):
    text = help_text(target)
    named = sorted({f for t, flags in COMMANDS if t == target for f in flags})
    unknown = [f for f in named if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not unknown, f"README passes {unknown} to `python {target}`, whose --help does not list them"


def test_the_catalog_check_prints_what_the_readme_shows():
    lines = bash_lines()
    at = lines.index("python -m orchestrator.catalog tools.json")
    shown = lines[at + 1].removeprefix("# ")
    done = subprocess.run([sys.executable, "-m", "orchestrator.catalog", "tools.json"], cwd=ROOT, timeout=300,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == shown
