"""run.compile_artifacts: the first run writes what it compiled into one file; a fresh process with empty
Inductor/Triton caches loads it and compiles nothing again (torch.compile with Inductor on the CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.compile_cache import load_compile_artifacts, save_compile_artifacts
from training.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys, torch
from torch._dynamo.utils import counters
from training.compile_cache import load_compile_artifacts, save_compile_artifacts
note = load_compile_artifacts(sys.argv[1])
f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos(), backend="inductor")
f(torch.randn(8))
written = save_compile_artifacts(sys.argv[1])
print(json.dumps({"note": note, "written": written, "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
                  "fx_misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def run_fresh(artifacts: Path, cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(artifacts)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_with_empty_caches_loads_the_artifacts_instead_of_compiling(tmp_path):
    artifacts = tmp_path / "compiled.bin"
    first = run_fresh(artifacts, tmp_path / "cache-1")
    assert first["note"] is None and first["written"] > 0 and artifacts.stat().st_size == first["written"]
    assert first["fx_misses"] >= 1 and first["fx_hits"] == 0
    second = run_fresh(artifacts, tmp_path / "cache-2")   # another, empty cache folder: only the file carries over
    assert second["note"].startswith("run.compile_artifacts: loaded") and second["written"] == 0
    assert second["fx_hits"] >= 1 and second["fx_misses"] == 0


def test_unset_missing_and_bad_paths(tmp_path):
    assert load_compile_artifacts(None) is None and save_compile_artifacts(None) == 0
    assert load_compile_artifacts(str(tmp_path / "new.bin")) is None   # missing: written after step 1
    with pytest.raises(ConfigError, match="run.compile_artifacts"):
        load_compile_artifacts(str(tmp_path / "no-such-folder" / "x.bin"))
    with pytest.raises(ConfigError, match="run.compile_artifacts"):
        load_compile_artifacts(str(tmp_path))   # a folder, not a file
    bad = tmp_path / "garbage.bin"
    bad.write_bytes(b"not a cache")
    assert "not loaded" in load_compile_artifacts(str(bad))
