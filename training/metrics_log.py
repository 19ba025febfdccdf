"""Where training metrics go: a local JSONL file, wandb (offline by default), the console.

- `metrics.jsonl` in the run dir: one object per step, appended and flushed as it is
  written (nothing is lost if the job dies); on resume, lines past the checkpoint's
  step are dropped so the file never holds two versions of a step.
- wandb: `offline` needs no account (sync later with `wandb sync <run dir>/wandb/...`);
  the run id is kept in checkpoints so a resumed job continues the same wandb run.
- console: a rich table row per step with the key numbers, and a progress bar while
  the step's rollouts run.

(Named `training.metrics_log`, not `training.logging`, which shadowed the standard library's
`logging` whenever training/ was on `sys.path`.)
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# (metric key, column title, format) shown on the console, in this order
CONSOLE_COLUMNS = [
    ("step", "step", "{:d}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("rollout/accuracy", "acc", "{:.2f}"),
    ("rollout/cost", "$/rollout", "{:.2e}"),
    ("rollout/turns", "turns", "{:.2f}"),
    ("filter/groups_kept", "groups", "{:.0f}"),
    ("train/samples", "samples", "{:.0f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("train/grad_norm", "|g|", "{:.3f}"),
    ("train/kl_loss", "kl", "{:.2e}"),
    ("time/step", "s/step", "{:.1f}"),
]


class MetricsLogger:
    """Writes each step's metrics to metrics.jsonl, wandb and the console."""

    def __init__(self, run_dir: str | Path, *, config: dict[str, Any], name: str, project: str,
                 wandb_mode: str = "offline", wandb_id: str | None = None, console: bool = True,
                 resume_step: int | None = None, total_steps: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None:
            self._truncate_after(resume_step)
        self._file = self.path.open("a")
        self.console = Console(quiet=not console)
        self.total_steps = total_steps
        self._header_printed = False
        self.wandb_run = None
        if wandb_mode != "disabled":
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError(f"logging.wandb={wandb_mode} needs the wandb package ({exc}): "
                                   "pip install wandb, or set logging.wandb=disabled") from exc
            # the same id resumes the same run (offline: a new offline-run-* folder with that id)
            self.wandb_run = wandb.init(mode=wandb_mode, dir=str(self.run_dir), project=project, name=name,
                                        id=wandb_id, resume="allow", config=config)

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def _truncate_after(self, step: int) -> None:
        """Drop lines of steps > `step` (written after the checkpoint we resume from)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", -1) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **metrics}
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        self._print_row(record)

    def message(self, text: str) -> None:
        self.console.print(text)

    def progress(self, description: str, total: int) -> Progress:
        """A rich progress bar for one phase (use as a context manager; advance per episode)."""
        return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)

    def _print_row(self, record: dict[str, Any]) -> None:
        table = Table(show_header=not self._header_printed, box=None, pad_edge=False)
        for _, title, _ in CONSOLE_COLUMNS:
            table.add_column(title, justify="right", min_width=8)
        cells = []
        for key, _, fmt in CONSOLE_COLUMNS:
            value = record.get(key)
            if key == "step" and self.total_steps:
                cells.append(f"{value}/{self.total_steps}")
            elif isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                cells.append(fmt.format(value) if key != "step" else str(value))
            else:
                cells.append("-")
        table.add_row(*cells)
        self.console.print(table)
        self._header_printed = True

    def close(self) -> None:
        """Close metrics.jsonl and finish the wandb run; safe to call twice.  A failing
        `finish()` is reported, not raised: by then metrics.jsonl and the checkpoints are
        complete, and the caller may be on its way out (SIGTERM: save, close, exit 143)."""
        self._file.close()
        run, self.wandb_run = self.wandb_run, None
        if run is not None:
            try:
                run.finish()
                import wandb  # lazy: only with a W&B run

                # finish() returns before wandb's service has written the run's files (offline:
                # run-<id>.wandb is still empty then). Stopping the service flushes them, so they
                # are complete on return, also before os._exit on SIGTERM; only when no other run
                # of this process still needs the service.
                if wandb.run is None:
                    wandb.teardown()
            except Exception as exc:  # noqa: BLE001 - any wandb failure; the run's own files are intact
                print(f"warning: wandb could not finish run {run.id} ({type(exc).__name__}: {exc}); "
                      f"metrics.jsonl and checkpoints are complete, the wandb files under "
                      f"{self.run_dir / 'wandb'} may lack the last records", file=sys.stderr)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
