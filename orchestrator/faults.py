"""Moved: the fault injection of the chaos tests and benchmarks is bench/faults.py (issue 46: it is
no part of the orchestrator; the tests and benches use it).  This name is kept for one release: it
says so and loads that file."""
import importlib.util
import sys
import warnings
from pathlib import Path

_MOVED = Path(__file__).resolve().parents[1] / "bench" / "faults.py"
warnings.warn(f"orchestrator.faults moved to bench/faults.py: put bench/ on sys.path and `import faults` "
              f"(this alias goes in the next release)", FutureWarning, stacklevel=2)
if not _MOVED.is_file():
    raise ImportError(f"orchestrator.faults moved to bench/faults.py, which is not here ({_MOVED}): "
                      f"use a clone of the repository")
_spec = importlib.util.spec_from_file_location("faults", _MOVED)
_module = sys.modules.setdefault("faults", importlib.util.module_from_spec(_spec))
if _module.__spec__ is _spec:
    _spec.loader.exec_module(_module)
sys.modules[__name__] = _module
