"""How far the warm-up moved the tiny policy's token table, for the tokens it never reads.

    python bench/quickstart_table_drift.py RUN_DIR [RUN_DIR ...]      # a quickstart run folder each

Compares RUN_DIR/policy-init with RUN_DIR/policy-warm (and the last GRPO checkpoint, where one is
kept): over the rows of tokens that no world file (RUN_DIR/world/*.jsonl) and no preference wording
holds, the mean length of a row's move, the length of the mean move (equal to it when every such row
moved by one common vector) and a row's starting length; then, for each held-out paraphrase, its
words that no training wording holds.  docs/history.md, issue 43 round 8, reads the numbers.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def table(folder: Path) -> torch.Tensor:
    """The token table (embed_tokens) of the *.safetensors under `folder`."""
    for f in sorted(folder.rglob("*.safetensors")):
        tensors = load_file(f)
        name = next((k for k in tensors if k.endswith("embed_tokens.weight")), None)
        if name:
            return tensors[name].float()
    raise SystemExit(f"{folder}: no embed_tokens.weight in a *.safetensors; pass a quickstart run folder")


def token_ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def drift(start: torch.Tensor, end: torch.Tensor, rows: torch.Tensor) -> dict[str, float]:
    """Mean |move| of `rows`, |mean move| (the common part), mean |start row|."""
    moved = (end - start)[rows]
    return {"mean_move": moved.norm(dim=1).mean().item(), "common_move": moved.mean(0).norm().item(),
            "start_norm": start[rows].norm(dim=1).mean().item()}


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from training.checkpoint import list_checkpoints
    from training.quickstart.env import FAVOURED_ALIAS, PARAPHRASES, WORDINGS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for run in args.runs:
        start, tok = table(run / "policy-init"), AutoTokenizer.from_pretrained(run / "policy-warm")
        worded = {t for lines in WORDINGS.values() for line in lines for t in token_ids(tok, line.format(alias=FAVOURED_ALIAS))}
        seen = worded | {t for f in (run / "world").glob("*.jsonl") for line in f.open() for t in token_ids(tok, line)}
        unread = torch.tensor(sorted(set(range(start.shape[0])) - seen))
        stages = {"warm-up": run / "policy-warm"}
        checkpoints = list_checkpoints(run / "train" / "checkpoints")      # complete ones, oldest first
        if checkpoints:
            stages["after GRPO"] = checkpoints[-1] / "model"
        print(f"{run}: {len(unread)} rows of unread tokens")
        for stage, folder in stages.items():
            d = drift(start, table(folder), unread)
            print(f"  {stage:11s} mean |move| {d['mean_move']:.3f}, |mean move| {d['common_move']:.3f}, "
                  f"|start row| {d['start_norm']:.3f}")
        for preset, line in PARAPHRASES.items():
            new = [tok.decode([t]) for t in token_ids(tok, line.format(alias=FAVOURED_ALIAS))
                   if t not in worded]
            print(f"  {preset} paraphrase, words no wording holds: {new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
