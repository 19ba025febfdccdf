"""bench/quickstart_kernel_paths.py: what of two runs is bit-identical, on hand-made run folders."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from quickstart_kernel_paths import main  # noqa: E402


def run_dir(root: Path, weight: float, cost: float) -> Path:
    (root / "world").mkdir(parents=True)
    (root / "world" / "train.jsonl").write_text('{"q": 1}\n')
    (root / "world" / "index.bin").write_bytes(bytes([int(weight * 10)]))
    for policy in ("policy-init", "policy-warm"):
        (root / policy).mkdir()
        save_file({"a": torch.zeros(2), "b": torch.full((2,), weight if policy == "policy-warm" else 1.0)},
                  str(root / policy / "model.safetensors"))
    (root / "eval_initial_cost.jsonl").write_text(
        "".join(json.dumps({"tool_calls": {"answer-1": 1}, "correct": True, "cost": c}) + "\n" for c in (1e-4, cost)))
    return root


def test_identical_and_differing_items_are_named(tmp_path, capsys):
    a, b = run_dir(tmp_path / "a", 1.0, 2e-4), run_dir(tmp_path / "b", 1.5, 3e-4)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "world: 1 of 2 files identical (differ: ['index.bin'])"
    assert out[1] == "policy-init: 2 of 2 tensors bit-identical, largest difference 0"
    assert out[2] == "policy-warm: 1 of 2 tensors bit-identical, largest difference 0.5"
    assert out[3] == "eval_initial_cost: same calls 2/2, same verdict 2/2, same cost 1/2"
