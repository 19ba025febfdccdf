"""`make quickstart`: the learning quickstart: GRPO visibly teaches a small orchestrator, on CPU.

    python -m training.quickstart [--out runs/quickstart] [--train-tasks 48] [--eval-tasks 32] [key=value ...]

Stages (each printed with its wall time):
  1. world: corpus + train / held-out tasks + a MiniLM/FAISS index (training/quickstart/env.py);
  2. policy: a tiny random Llama with SmolLM2's tokenizer, warmed up on demonstrations
     that pick aliases uniformly (training/quickstart/warmup.py) = the starting policy;
  3. initial evaluation on the held-out tasks (experts not memoized: real latency);
  4. GRPO with training/configs/quickstart.yaml (`python training/train.py` does the same);
  5. final evaluation on the same held-out tasks, with the same sampling seeds;
  6. summary.json (`initial` and `final`: accuracy, cost_per_task $, latency_per_task s,
     tool_calls_per_task per alias) and training_curves.png (reward, accuracy, cost per step).

Trailing `key=value` arguments override the trainer config (e.g. trainer.total_steps=20).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.context import Budgets
from orchestrator.loop import Task
from training.checkpoint import list_checkpoints
from training.config import TrainConfig, load_config
from training.quickstart.env import FAVOURED_ALIAS, PREFERENCE, build_index, build_world, quickstart_catalog
from training.rollouts import collect_rollouts
from training.scoring import make_judge
from training.tasks import load_tasks

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
EVAL_STEP = 1_000_000          # sampling seeds of the evaluations (same for initial and final)
console = Console()


def _paths_overrides(out: Path) -> list[str]:
    """Point the trainer config at this output folder (the YAML's defaults assume runs/quickstart)."""
    world = out / "world"
    return [f"run.dir={out / 'train'}", f"model.path={out / 'policy-warm'}",
            f"data.train_files=[{world / 'train.jsonl'}]", f"tools.catalog={world / 'tools.json'}",
            f"tools.index={world / 'index'}"]


def prepare_world(out: Path, cfg: TrainConfig, args) -> dict[str, Path]:
    paths = build_world(out / "world", n_train=args.train_tasks, n_eval=args.eval_tasks,
                        n_warmup=args.warmup_tasks, seed=cfg.run.seed)
    quickstart_catalog(out / "world")
    paths["index"] = build_index(paths["corpus"], out / "world" / "index")
    return paths


def prepare_policy(out: Path, cfg: TrainConfig, runtime, demo_tasks: list[Task], args) -> tuple[Path, dict]:
    """Tiny random policy with SmolLM2's tokenizer, then the supervised warm-up.

    Returns the warmed-up folder and the alias distribution it was taught (per tool)."""
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.warmup import demonstrations, prompted_alias_prior, supervised_warmup, with_alias_prior
    from training.tiny_policy import build_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    init = build_tiny_policy(out / "policy-init", tokenizer, hidden=args.hidden, layers=args.layers,
                             heads=4, seed=cfg.run.seed)
    demos = demonstrations(demo_tasks, tokenizer, runtime.catalog, runtime.retriever, prompts=runtime.prompts,
                           budgets=Budgets(context_tokens=cfg.rollout.context_tokens), topk=cfg.tools.topk)
    if args.alias_prior == "prompted":
        demos = with_alias_prior(demos, prompted_alias_prior(demos), floor=args.alias_floor)
    taught = {}
    for d in demos:
        for pos, target in d.targets.items():
            if len(target) > 1:
                taught[d.tool] = {tokenizer.decode([t]): round(p, 3) for t, p in target.items()}
    console.print(f"warm-up: {len(demos)} demonstrated turns from {len(demo_tasks)} tasks; "
                  f"alias distribution taught ({args.alias_prior}): {taught}")
    warm = supervised_warmup(init, out / "policy-warm", demos, epochs=args.warmup_epochs, lr=args.warmup_lr,
                             batch_size=args.warmup_batch, seed=cfg.run.seed, log=console.print)
    return warm, taught


def evaluate(model_dir: Path, tasks: list[Task], runtime, cfg: TrainConfig, judge, temperature: float,
             concurrency: int, sink: Path) -> dict:
    """One episode per held-out task; the foundation quickstart's four numbers + tool shares.

    Few episodes run at once (`concurrency`): a tool call's latency is its wall time, and on
    2 cores every extra concurrent expert call would stretch the others'."""
    from evaluation.quickstart_loop import summarise
    from training.train import _strip_tokens, load_policy, make_engine_for, rollout_loop_config

    model, tokenizer = load_policy(str(model_dir), cfg.model.dtype, cfg.run.device)
    engine = make_engine_for(cfg, model, tokenizer)
    loop = rollout_loop_config(cfg, temperature)
    try:
        groups = collect_rollouts(tasks, engine, runtime, loop, rollouts_per_task=1, seed=cfg.run.seed,
                                  step=EVAL_STEP, price_model=cfg.model.price_model,
                                  concurrency=concurrency)
    finally:
        getattr(engine, "close", lambda: None)()
    rollouts = [g[0] for g in groups]
    correct = [bool(r.finished and judge(t, r)) for t, r in zip(tasks, rollouts)]
    with sink.open("w") as f:
        for task, r, ok in zip(tasks, rollouts, correct):
            f.write(json.dumps({"question": task.question, "reference": task.answer, "correct": ok,
                                **_strip_tokens(r)}) + "\n")
    summary = summarise(rollouts, correct)
    calls = summary["tool_calls_per_task"]
    search = sum(v for a, v in calls.items() if a.startswith("search-"))
    summary["favoured_share"] = calls.get(FAVOURED_ALIAS, 0.0) / max(1e-9, sum(calls.values()))
    summary["favoured_share_of_search"] = calls.get(FAVOURED_ALIAS, 0.0) / max(1e-9, search)
    return summary


def plot(metrics_file: Path, initial: dict, final: dict, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.metrics_log import read_metrics

    rows = read_metrics(metrics_file)
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = [("reward/mean", "reward (train rollouts)", None),
              ("rollout/accuracy", "accuracy", "accuracy"),
              ("rollout/cost", "cost per rollout ($)", "cost_per_task")]
    for ax, (key, title, eval_key) in zip(axes, panels):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker="o", label="train rollouts (T=1)")
        if eval_key:
            ax.scatter([0, steps[-1] if steps else 1], [initial[eval_key], final[eval_key]], color="red",
                       zorder=3, label="held-out eval")
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def checks(initial: dict, final: dict) -> dict:
    cut = 1 - final["cost_per_task"] / max(1e-12, initial["cost_per_task"])
    return {"cost_reduction": round(cut, 4), "cost_at_least_40pct_lower": cut >= 0.40,
            "accuracy_not_lower": final["accuracy"] >= initial["accuracy"],
            "favoured_share_rises": final["favoured_share"] > initial["favoured_share"]}


def print_table(initial: dict, final: dict, result: dict) -> None:
    table = Table(title="quickstart: the same held-out tasks, before and after GRPO")
    for col in ("", "initial (warm-up)", "final (GRPO)"):
        table.add_column(col, justify="right")
    rows = [("accuracy", "accuracy", "{:.2f}"), ("$ / task", "cost_per_task", "{:.6f}"),
            ("s / task (tool latency)", "latency_per_task", "{:.2f}"),
            (f"{FAVOURED_ALIAS} share of calls", "favoured_share", "{:.2f}")]
    for title, key, fmt in rows:
        table.add_row(title, fmt.format(initial[key]), fmt.format(final[key]))
    aliases = sorted(set(initial["tool_calls_per_task"]) | set(final["tool_calls_per_task"]))
    for alias in aliases:
        table.add_row(f"{alias} calls / task", f"{initial['tool_calls_per_task'].get(alias, 0):.2f}",
                      f"{final['tool_calls_per_task'].get(alias, 0):.2f}")
    console.print(table)
    console.print(f"cost per task {-100 * result['cost_reduction']:+.0f}%; "
                  + ", ".join(f"{k}: {v}" for k, v in result.items() if k != "cost_reduction"))


def _machine_load() -> dict:
    """CPU seconds used (this process and its children, e.g. the sandbox) and the load average:
    on a shared machine wall time alone says little about what the run itself needs."""
    import resource

    used = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
    return {"cpu_seconds": round(used, 1), "cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 1)}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--train-tasks", type=int, default=48, help="training tasks (half lookup, half arithmetic)")
    parser.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks")
    parser.add_argument("--warmup-tasks", type=int, default=48, help="extra tasks demonstrated in the warm-up")
    parser.add_argument("--eval-temperature", type=float, default=0.6, help="paper: 0.6 for validation")
    parser.add_argument("--eval-concurrency", type=int, default=2, help="held-out episodes at once")
    parser.add_argument("--hidden", type=int, default=64, help="tiny policy width")
    parser.add_argument("--layers", type=int, default=2, help="tiny policy depth")
    parser.add_argument("--alias-prior", choices=["prompted", "uniform"], default="prompted",
                        help="alias distribution the warm-up teaches: the prompted SmolLM2's, or uniform")
    parser.add_argument("--alias-floor", type=float, default=0.5,
                        help="prompted prior mixed with uniform by this weight (exploration floor)")
    parser.add_argument("--warmup-epochs", type=int, default=8)
    parser.add_argument("--warmup-lr", type=float, default=1e-2)
    parser.add_argument("--warmup-batch", type=int, default=8)
    parser.add_argument("overrides", nargs="*", help="trainer config overrides, key=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from training.train import build_runtime, run

    args = _args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started, stages = time.monotonic(), {}
    out = args.out
    cfg = load_config(CONFIG, _paths_overrides(out) + list(args.overrides))
    shutil.rmtree(out / "train", ignore_errors=True)   # a demo: every run starts from scratch
    if cfg.run.threads:            # the evaluations and warm-up run with the trainer's setting too
        import torch
        torch.set_num_threads(cfg.run.threads)

    def stage(name: str, t0: float) -> None:
        stages[name] = round(time.monotonic() - t0, 1)
        console.print(f"[bold]{name}[/]: {stages[name]} s")

    t0 = time.monotonic()
    world = prepare_world(out, cfg, args)
    train_tasks, eval_tasks = load_tasks([str(world["train"])]), load_tasks([str(world["eval"])])
    demo_tasks = train_tasks + (load_tasks([str(world["warmup"])]) if args.warmup_tasks else [])
    eval_runtime = build_runtime(dataclasses.replace(cfg, tools=dataclasses.replace(cfg.tools, memoize_experts=False)))
    judge = make_judge(cfg.reward.judge, cfg.reward.judge_model)
    stage("world", t0)
    t0 = time.monotonic()
    warm, taught = prepare_policy(out, cfg, eval_runtime, demo_tasks, args)
    stage("warm-up", t0)
    t0 = time.monotonic()
    initial = evaluate(warm, eval_tasks, eval_runtime, cfg, judge, args.eval_temperature, args.eval_concurrency,
                       out / "eval_initial.jsonl")
    stage("initial evaluation", t0)
    t0 = time.monotonic()
    run(cfg)
    stage("GRPO", t0)
    t0 = time.monotonic()
    final_model = list_checkpoints(Path(cfg.run.dir) / "checkpoints")[-1] / "model"
    final = evaluate(final_model, eval_tasks, eval_runtime, cfg, judge, args.eval_temperature, args.eval_concurrency,
                     out / "eval_final.jsonl")
    stage("final evaluation", t0)

    result = checks(initial, final)
    png = plot(Path(cfg.run.dir) / "metrics.jsonl", initial, final, out)
    # top level: the foundation quickstart's four keys, for the trained (final) policy
    headline = {k: final[k] for k in ("accuracy", "cost_per_task", "latency_per_task", "tool_calls_per_task")}
    summary = {**headline, "initial": initial, "final": final, "checks": result, "favoured_alias": FAVOURED_ALIAS,
               "preference": PREFERENCE, "eval_temperature": args.eval_temperature,
               "warmup_alias_distribution": {"source": args.alias_prior, "floor": args.alias_floor,
                                             "per_tool": taught},
               "train_tasks": len(train_tasks), "eval_tasks": len(eval_tasks), "plot": png.name,
               "config": str(Path(cfg.run.dir) / "config.yaml"), "stage_seconds": stages,
               "wall_seconds": round(time.monotonic() - started, 1)}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    print_table(initial, final, result)
    console.print(f"summary: {out / 'summary.json'}  plot: {png}  wall time: {summary['wall_seconds']} s\n"
                  f"held-out trajectories: {out / 'eval_initial.jsonl'}, {out / 'eval_final.jsonl'}; "
                  f"training: {Path(cfg.run.dir) / 'metrics.jsonl'}, {Path(cfg.run.dir) / 'rollouts.jsonl'}")
    return 0
