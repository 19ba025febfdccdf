"""Tool kinds (one module each, registry.py) and the toolbox that runs function tools (toolbox.py).
docs/tools.md is the add-a-tool guide."""
from orchestrator.tools.registry import KINDS, load_builtin_kinds

load_builtin_kinds()

__all__ = ["KINDS", "load_builtin_kinds"]
