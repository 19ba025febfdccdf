"""Train an orchestrator with GRPO on multi-turn tool rollouts (PAPER.md §4-5).

    python training/train.py --config training/configs/quickstart.yaml [key=value ...]
    python training/train.py --config training/configs/paper.yaml optim.lr=5e-7 run.dir=runs/x

The config (training/config.py) holds the run and the algorithm; `tools.profile` names the
settings profile (configs/profiles/) whose `qa.train` / `tau2.train` sections give the experts,
judge, retrieval and costs, as evaluation reads its own sections of the same file.
`run.resume: auto` continues from the newest checkpoint in `<run.dir>/checkpoints`;
SIGTERM (Slurm pre-emption) saves a checkpoint and exits with status 143.
The step and the loop are training/session.py; docs/training.md explains both.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.fail_closed import FailClosed
from orchestrator.resources import raise_nofile_limit
from training import checkpoint as ckpt
from training.config import ConfigError, dump_yaml, load_config
from training.session import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="overrides: section.key=value, the value parsed as YAML "
                                            "(e.g. optim.lr=1e-5 rollout.constrained=true)")
    parser.add_argument("--config", type=Path, required=True, help="a YAML file in training/configs/")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0

    raise_nofile_limit()   # soft open-files limit up to the hard one; one line when it cannot
    try:
        run(cfg)
    except (ConfigError, ckpt.CheckpointError, FileNotFoundError, ValueError, FailClosed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
