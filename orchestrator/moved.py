"""Old module names kept for one release after a move (issue 46): the file at the old path holds
only `forward(__name__, "<new module>")`, which says where the module went and hands over to it.

Imported, the old name warns (FutureWarning) and is the new module (same objects, same state);
run as `python -m <old name>`, it says so on stderr and runs the new module as __main__.
Nothing inside the packages imports an old name (tests/test_imports.py checks it); the next
release deletes them."""
from __future__ import annotations

import importlib
import runpy
import sys
import warnings


def forward(name: str, new: str) -> None:
    """Hand the module `name` (the caller's `__name__`) over to the module `new`."""
    if name == "__main__":
        spec = sys.modules["__main__"].__spec__            # None when run as a file path
        old = spec.name if spec is not None else sys.argv[0]
        print(f"{old} moved to {new}: run `python -m {new}` (the old name goes in the next release)",
              file=sys.stderr)
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    warnings.warn(f"{name} moved to {new}: import {new} (the old name goes in the next release)",
                  FutureWarning, stacklevel=3)
    sys.modules[name] = importlib.import_module(new)
