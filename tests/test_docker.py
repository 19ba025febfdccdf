"""docker/Dockerfile and docker/Dockerfile.cpu stay in step with the repository (no Docker engine here).

A small lint: the files each image COPYs exist, the CPU image installs what `make
quickstart` installs (same torch pin, extras, embedded-model wheel), and every pin the GPU
image states agrees with pyproject's `gpu` extra.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = {"gpu": REPO / "docker" / "Dockerfile", "cpu": REPO / "docker" / "Dockerfile.cpu"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, args = line.strip().partition(" ")
            out.append((word.upper(), args.strip()))
    return out


def install_specs(command: str) -> list[str]:
    """Requirements named by one `pip install ...` command (quotes stripped, options skipped)."""
    tokens = command.split()
    if "install" not in tokens:
        return []
    specs, skip_next = [], False
    for tok in tokens[tokens.index("install") + 1:]:
        if skip_next:
            skip_next = False
        elif tok in ("-r", "--index-url", "--extra-index-url", "-c"):
            skip_next = True
        elif not tok.startswith("-"):
            specs.append(tok.strip("'\""))
    return specs


def pip_specs(path: Path) -> list[str]:
    """Every requirement a `pip install` in the Dockerfile's RUN lines names."""
    return [spec for word, args in instructions(path) if word == "RUN"
            for command in re.split(r"&&|;", args) if "pip" in command.split()
            for spec in install_specs(command)]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_every_copied_file_exists(kind):
    for word, args in instructions(DOCKERFILES[kind]):
        if word == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            for source in sources:
                assert source == "." or (REPO / source).exists(), (
                    f"{DOCKERFILES[kind].relative_to(REPO)} copies {source}, which is not in the repository")


def test_cpu_image_installs_what_make_installs():
    makefile = (REPO / "Makefile").read_text()
    torch_pin = re.search(r"^TORCH\s*\?=\s*(\S+)", makefile, re.M).group(1)
    core = re.search(r"^\$\(VENV\)/\.core:.*?(?=^\S)", makefile, re.M | re.S).group(0)
    # the Makefile installs with uv (`$(UV_PIP) SPEC...`: uv pip install with pip's settings)
    make_specs = [spec for line in core.splitlines() if "$(UV_PIP)" in line
                  for spec in install_specs(line.replace("$(UV_PIP)", "pip install"))]
    specs = pip_specs(DOCKERFILES["cpu"])
    assert torch_pin in specs, f"Dockerfile.cpu must install {torch_pin} (the Makefile's TORCH)"
    missing = [spec for spec in make_specs if spec != "$(TORCH)" and spec not in specs]
    assert not missing, f"the Makefile's core environment installs {missing}; Dockerfile.cpu does not"
    assert make_specs, "found no `$(UV_PIP)` lines in the Makefile's .core target (update this test)"


def test_gpu_image_pins_agree_with_the_gpu_extra():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    by_name = {_name(s): s.replace(" ", "") for s in extra}
    for spec in pip_specs(DOCKERFILES["gpu"]):
        if spec in (".", "-e") or spec.startswith((".", "/")):
            continue
        name = _name(spec)
        if name in by_name:
            assert spec.replace(" ", "") == by_name[name], (
                f"docker/Dockerfile installs {spec!r} but pyproject's gpu extra says {by_name[name]!r}")


def test_requirements_pins_satisfy_the_gpu_extra():
    """requirements.txt (what docker/Dockerfile installs) lists every gpu-extra package at a
    version the extra allows."""
    from packaging.requirements import Requirement

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    lines = [l.split("#")[0].strip() for l in (REPO / "requirements.txt").read_text().splitlines()]
    pinned = {Requirement(l).name.lower(): Requirement(l) for l in lines if l}
    for spec in map(Requirement, extra):
        if spec.name == "flash-attn":          # built in its own RUN line against the installed torch
            continue
        assert spec.name.lower() in pinned, f"requirements.txt lacks {spec.name} (pyproject gpu extra: {spec})"
        versions = [s.version for s in pinned[spec.name.lower()].specifier if s.operator == "=="]
        for version in versions:
            assert spec.specifier.contains(version, prereleases=True), (
                f"requirements.txt pins {spec.name}=={version}, outside the gpu extra's {spec.specifier}")
