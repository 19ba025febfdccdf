"""bench/quickstart_table_drift.py: how far the unread rows of the token table moved, hand-worked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from quickstart_table_drift import drift, table  # bench/ is scripts, not a package


def test_a_common_move_and_moves_that_cancel_are_told_apart():
    start = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, 0.0], [6.0, 8.0]])
    common = start + torch.tensor([[0.0, 1.0]])                              # every row moved by (0, 1)
    assert drift(start, common, torch.tensor([1, 2])) == pytest.approx(
        {"mean_move": 1.0, "common_move": 1.0, "start_norm": 0.0})
    apart = start + torch.tensor([[0.0, 0.0], [3.0, 4.0], [-3.0, -4.0], [0.0, 0.0]])   # rows 1, 2: opposite moves
    assert drift(start, apart, torch.tensor([1, 2])) == pytest.approx(
        {"mean_move": 5.0, "common_move": 0.0, "start_norm": 0.0})
    assert drift(start, common, torch.tensor([0, 3]))["start_norm"] == pytest.approx(7.5)   # (5 + 10) / 2


def test_a_folder_without_a_token_table_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no embed_tokens.weight"):
        table(tmp_path)
