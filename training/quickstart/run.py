"""`make quickstart`: the learning quickstart: GRPO visibly teaches a small orchestrator, on CPU.

    python -m training.quickstart [--out runs/quickstart] [--train-tasks 16] [--eval-tasks 16] [--seeds 3] [key=value ...]

Stages (each printed with its wall time):
  1. world: corpus + train / held-out tasks + a MiniLM/FAISS index (training/quickstart/env.py);
  2. policy: a tiny random Llama with SmolLM2's tokenizer, warmed up on demonstrations
     that pick aliases as the prompted SmolLM2 does (training/quickstart/warmup.py) = the
     starting policy;
  3. initial evaluation on the held-out tasks under each preference preset and the unseen
     catalog (greedy experts memoized);
  4. GRPO with training/configs/quickstart.yaml (`python training/train.py` does the same);
  5. final evaluation on the same held-out tasks, with the same sampling seeds;
  6. summary.json (`initial` and `final`: accuracy, cost_per_task $, latency_per_task s,
     tool_calls_per_task per alias) and training_curves.png (reward, accuracy, cost per step).

Trailing `key=value` arguments override the trainer config (e.g. trainer.total_steps=20).
"""
from __future__ import annotations

import argparse
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
from training.quickstart.env import (
    DEEP,
    FAVOURED_ALIAS,
    MAIN_PRESET,
    PRESETS,
    SHALLOW,
    TOOL_ALIASES,
    TRAIN_MIX,
    UNSEEN_TOOLS,
    build_index,
    build_world,
    quickstart_catalog,
    routed_runtime,
    with_preference,
)
from training.rollouts import collect_rollouts
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
    paths["index-shallow"] = build_index(paths["places"], out / "world" / "index-shallow")
    return paths


def prepare_policy(out: Path, cfg: TrainConfig, runtime, demo_tasks: list[Task], args) -> tuple[Path, dict]:
    """Tiny random policy with SmolLM2's tokenizer, then the supervised warm-up.

    Returns the warmed-up folder and the alias distribution it was taught (per tool)."""
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.warmup import (
        _alias_positions,
        demonstrations,
        prompted_alias_choices,
        prompted_alias_prior,
        supervised_warmup,
        with_alias_prior,
        with_own_alias_choices,
    )
    from training.tiny_policy import build_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    demo_tasks = demonstrated_tasks(demo_tasks, args.demo_presets)
    init = build_tiny_policy(out / "policy-init", tokenizer, hidden=args.hidden, layers=args.layers,
                             heads=4, seed=cfg.run.seed, local_window=args.local_window or None)
    demos = demonstrations(demo_tasks, tokenizer, runtime.catalog, runtime.retriever, prompts=runtime.prompts,
                           budgets=Budgets(context_tokens=cfg.rollout.context_tokens), topk=runtime.qa.retrieval.topk,
                           tool_spread=args.tool_spread, spread_to=args.spread_to)
    if args.alias_prior == "per-turn":
        demos = with_own_alias_choices(demos, prompted_alias_choices(demos), floor=args.alias_floor)
    elif args.alias_prior == "pooled":
        demos = with_alias_prior(demos, prompted_alias_prior(demos), floor=args.alias_floor)
    taught: dict = {}           # tool -> preset -> mean alias distribution taught
    for d in demos:
        for pos in _alias_positions(d):
            mean = taught.setdefault(d.tool, {}).setdefault(d.preset or "-", {})
            for t, p in d.targets[pos].items():
                mean.setdefault(tokenizer.decode([t]), []).append(p)
    taught = {tool: {preset: {a: round(sum(ps) / len(ps), 3) for a, ps in dist.items()} for preset, dist in by.items()}
              for tool, by in taught.items()}
    console.print(f"warm-up: {len(demos)} demonstrated turns from {len(demo_tasks)} tasks; "
                  f"alias distribution taught ({args.alias_prior}): {taught}; other tools: {args.tool_spread}")
    warm = supervised_warmup(init, out / "policy-warm", demos, epochs=args.warmup_epochs, lr=args.warmup_lr,
                             batch_size=args.warmup_batch, seed=cfg.run.seed, alias_weight=args.alias_weight,
                             log=console.print)
    return warm, taught


def warmup_tasks(world: dict[str, Path], train_tasks: list[Task], args) -> list[Task]:
    """The tasks the warm-up demonstrates (before `demonstrated_tasks` expands them): the training
    tasks and the extra warm-up split."""
    return train_tasks + (load_tasks([str(world["warmup"])]) if args.warmup_tasks else [])


def demonstrated_tasks(tasks: list[Task], presets: str) -> list[Task]:
    """The warm-up's tasks: each under its own preset (`own`), or each under every preset in turn
    (`all`): prompts that differ only in the preference line, each demonstrated with the prompted
    model's own choice under that line, so that the policy can only fit them by reading it."""
    if presets == "own":
        return list(tasks)
    if presets == "all":
        return [with_preference(t, preset) for t in tasks for preset in PRESETS]
    raise ValueError(f"--demo-presets {presets!r}: expected 'own' or 'all'")


def evaluate(model_dir: Path, tasks: list[Task], runtime, cfg: TrainConfig, judge, temperature: float,
             concurrency: int, sink: Path, samples: int = 1) -> dict:
    """`samples` episodes per held-out task (each its own sampling seed); the foundation
    quickstart's four numbers + tool shares, as means over all episodes.

    Few episodes run at once (`concurrency`): a tool call's latency is its wall time, and on
    2 cores every extra concurrent expert call would stretch the others'."""
    from evaluation.quickstart_loop import summarise
    from training.learner import make_engine_for
    from training.policy_setup import load_policy
    from training.session import _strip_tokens, rollout_loop_config

    model, tokenizer = load_policy(str(model_dir), cfg.model.dtype, cfg.run.device)
    engine = make_engine_for(cfg, model, tokenizer, model_dir)
    loop = rollout_loop_config(cfg, temperature)
    try:
        groups = collect_rollouts(tasks, engine, runtime, loop, rollouts_per_task=samples, seed=cfg.run.seed,
                                  step=EVAL_STEP, price_model=cfg.model.price_model,
                                  concurrency=concurrency)
    finally:
        getattr(engine, "close", lambda: None)()
    tasks = [t for t, g in zip(tasks, groups) for _ in g]
    rollouts = [r for g in groups for r in g]
    correct = [bool(r.finished and judge(t, r)) for t, r in zip(tasks, rollouts)]
    with sink.open("w") as f:
        for task, r, ok in zip(tasks, rollouts, correct):
            f.write(json.dumps({"question": task.question, "reference": task.answer, "correct": ok,
                                **_strip_tokens(r)}) + "\n")
    return {**summarise(rollouts, correct), **favoured_shares(rollouts)}


def favoured_shares(rollouts) -> dict:
    """The favoured alias's share of its own tool's calls (`favoured_share`: the choice among the
    answer aliases; a share of all calls would also move when the policy makes fewer or more calls
    of other tools), and among all calls (`favoured_share_of_calls`)."""
    def share(aliases) -> float:
        mine = sum(r.tool_calls.get(FAVOURED_ALIAS, 0) for r in rollouts)
        return mine / max(1e-9, sum(n for r in rollouts for a, n in r.tool_calls.items() if aliases is None or a in aliases))

    own = next(aliases for aliases in TOOL_ALIASES.values() if FAVOURED_ALIAS in aliases)
    return {"favoured_share": share(set(own)), "favoured_share_of_calls": share(None)}


def evaluate_all(model_dir: Path, tasks: list[Task], runtime, cfg: TrainConfig, judge, args, out: Path,
                 tag: str) -> dict:
    """The policy on the same held-out tasks under every preset vector, and under the unseen
    catalog (main preset): {preset | "unseen_tools": summary}; trajectories to out/eval_<tag>_<name>.jsonl."""
    runs = {name: [with_preference(t, name) for t in tasks] for name in PRESETS}
    runs["unseen_tools"] = [with_preference(t, MAIN_PRESET, tools=UNSEEN_TOOLS) for t in tasks]
    return {name: evaluate(model_dir, ts, runtime, cfg, judge, args.eval_temperature, args.eval_concurrency,
                           out / f"eval_{tag}_{name}.jsonl", args.eval_samples) for name, ts in runs.items()}


def preference_scores(out: Path) -> dict:
    """The paper's preference reward (PAPER.md §4) of the final policy's held-out rollouts, per
    preset: for each task, the reward of its initial and final rollouts under that preset's
    vector, normalised over that pair (so 1 = the final policy did better on every weighted
    coordinate); returned as the mean over tasks for `initial` and `final`."""
    from training.rewards import preference_rewards

    scores = {}
    for name, (vector, _) in PRESETS.items():
        pairs = []
        for tag in ("initial", "final"):
            rows = [json.loads(line) for line in (out / f"eval_{tag}_{name}.jsonl").read_text().splitlines()]
            pairs.append(rows)
        totals = {"initial": 0.0, "final": 0.0}
        for a, b in zip(*pairs):
            group = [{"tool_calls": r["tool_calls"], "outcome": int(r["correct"]), "cost": r["cost"],
                      "latency": r["latency"]} for r in (a, b)]
            ra, rb = preference_rewards(group, vector)
            totals["initial"] += ra
            totals["final"] += rb
        n = max(1, len(pairs[0]))
        scores[name] = {k: round(v / n, 4) for k, v in totals.items()}
    return scores


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
    """The quickstart's claims, on the held-out tasks: under the main preset (accuracy + cost)
    accuracy up >= 5 points and cost per task down >= 40%; the favoured alias's share of its
    tool's calls (`favoured_share`: answer-4, env.FAVOURED_ALIAS, among the answer calls) rises under the `favour`
    preset and does not rise under the others."""
    main_i, main_f = initial[MAIN_PRESET], final[MAIN_PRESET]
    cut = 1 - main_f["cost_per_task"] / max(1e-12, main_i["cost_per_task"])
    gain = main_f["accuracy"] - main_i["accuracy"]
    out = {"cost_reduction": round(cut, 4), "accuracy_gain": round(gain, 4),
           "accuracy_up_5_points": gain >= 0.05 - 1e-9, "cost_at_least_40pct_lower": cut >= 0.40}
    if "favour" in final:
        out["favoured_share_rises_when_favoured"] = final["favour"]["favoured_share"] > initial["favour"]["favoured_share"]
        out["favoured_share_not_rising_otherwise"] = all(
            final[p]["favoured_share"] <= initial[p]["favoured_share"] + 1e-9 for p in PRESETS if p != "favour")
    return out


def print_table(initial: dict, final: dict, result: dict) -> None:
    table = Table(title="quickstart: the same held-out tasks, before -> after GRPO, per test-time preference")
    for col in ("preference", "accuracy", "$ / task", "s / task", f"{FAVOURED_ALIAS} share", "calls / task (final)"):
        table.add_column(col, justify="right")
    for name, f in final.items():
        i = initial[name]
        mix = ", ".join(f"{a} {v:.2f}" for a, v in f["tool_calls_per_task"].items())
        table.add_row(name, f"{i['accuracy']:.2f} -> {f['accuracy']:.2f}",
                      f"{i['cost_per_task']:.6f} -> {f['cost_per_task']:.6f}",
                      f"{i['latency_per_task']:.2f} -> {f['latency_per_task']:.2f}",
                      f"{i['favoured_share']:.2f} -> {f['favoured_share']:.2f}", mix)
    console.print(table)
    console.print(f"{MAIN_PRESET}: cost per task {-100 * result['cost_reduction']:+.0f}%, accuracy "
                  f"{100 * result['accuracy_gain']:+.1f} points; "
                  + ", ".join(f"{k}: {v}" for k, v in result.items() if k not in ("cost_reduction", "accuracy_gain")))


def _machine_load() -> dict:
    """CPU seconds used (this process and its children, e.g. the sandbox) and the load average:
    on a shared machine wall time alone says little about what the run itself needs."""
    import resource

    import torch

    used = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
    return {"cpu_seconds": round(used, 1), "cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 1),
            "cpu_model": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "packages": installed_packages()}


def _cpu_model() -> str:
    """/proc/cpuinfo's model name (platform.processor() elsewhere): with `cpu_capability`, the
    instruction set torch's kernels use (AVX2, AVX512, ...), which moves the run as packages do
    (docs/training.md, "the CPU moves the run too")."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def installed_packages() -> dict[str, str]:
    """Every installed distribution and its version (what `pip freeze` lists): the quickstart's
    numbers move with torch and transformers (docs/training.md, "Measured on today's packages")."""
    from importlib.metadata import distributions

    return dict(sorted((d.metadata["Name"], d.version) for d in distributions() if d.metadata["Name"]))


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--seed", type=int, default=0, help="run.seed of the (first) run")
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds (seed, seed+1, ...) into OUT/seed-K "
                        "and report each and the spread")
    parser.add_argument("--train-tasks", type=int, default=16, help="training tasks (half lookup, half arithmetic)")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks")
    parser.add_argument("--warmup-tasks", type=int, default=16, help="extra tasks demonstrated in the warm-up")
    parser.add_argument("--eval-temperature", type=float, default=0.6, help="paper: 0.6 for validation")
    parser.add_argument("--eval-samples", type=int, default=2,
                        help="episodes per held-out task (sampling seeds differ): the checks compare means over "
                             "tasks x samples, less noisy than one draw per task")
    parser.add_argument("--eval-concurrency", type=int, default=8, help="held-out episodes at once")
    parser.add_argument("--hidden", type=int, default=128, help="tiny policy width")
    parser.add_argument("--layers", type=int, default=2, help="tiny policy depth")
    parser.add_argument("--local-window", type=int, default=64,
                        help="tiny policy: every layer but the last attends to this many previous tokens only "
                             "(0: all layers see the whole prompt)")
    parser.add_argument("--alias-prior", choices=["pooled", "per-turn", "uniform"], default="per-turn",
                        help="alias distribution the warm-up teaches: the prompted SmolLM2's, pooled over presets "
                             "(one distribution per tool); the prompted SmolLM2's own choice at each demonstrated "
                             "turn (it reads the preference line); or uniform")
    parser.add_argument("--alias-floor", type=float, default=0.25,
                        help="prompted prior mixed with uniform by this weight (exploration floor)")
    parser.add_argument("--tool-spread", type=float, default=0.3,
                        help="share of the warm-up's tool decision given to the tools a question does not need")
    parser.add_argument("--spread-to", choices=["evidence", "all"], default="evidence",
                        help="which tools get --tool-spread: the other evidence tool only (a wasted call first) "
                             "or every other tool (also answering without evidence)")
    parser.add_argument("--demo-presets", choices=["own", "all"], default="all",
                        help="warm-up demonstrations of each task under its own preset only, or under every preset "
                             "(the prompted model's choice under each: prompts that differ only in the preference "
                             "line, so the policy learns to read that line rather than the question)")
    parser.add_argument("--warmup-epochs", type=int, default=24,
                        help="passes over the demonstrated turns (8 left the tool decision unlearned in one run; 12, 24 and 32 "
                             "did not make the start read the old preference lines in every seed; the lines' own tokens "
                             "did: docs/training.md, sixth and seventh rounds)")
    parser.add_argument("--warmup-lr", type=float, default=5e-3)
    parser.add_argument("--warmup-batch", type=int, default=8)
    parser.add_argument("--alias-weight", type=float, default=4.0,
                        help="weight of the alias decisions in the warm-up loss (tool decisions: 1); the answer "
                             "alias's targets are the only ones that differ between preference presets")
    parser.add_argument("overrides", nargs="*", help="trainer config overrides, key=value")
    args = parser.parse_args(argv)
    if args.alias_weight <= 0:
        parser.error(f"--alias-weight {args.alias_weight}: a loss weight, must be > 0")
    return args


def run_seed(args, seed: int, out: Path) -> dict:
    """The whole quickstart for one seed under `out`; returns its summary (also out/summary.json)."""
    from training.session import build_runtime, run, train_judge
    from training.rollouts import MemoizedLLM

    started, stages = time.monotonic(), {}
    cfg = load_config(CONFIG, _paths_overrides(out) + [f"run.seed={seed}"] + list(args.overrides))
    shutil.rmtree(out / "train", ignore_errors=True)   # a demo: every run starts from scratch
    if cfg.run.threads:            # the evaluations and warm-up run with the trainer's setting too
        import torch
        torch.set_num_threads(cfg.run.threads)

    def stage(name: str, t0: float) -> None:
        stages[name] = round(time.monotonic() - t0, 1)
        console.print(f"[bold]seed {seed}: {name}[/]: {stages[name]} s")

    t0 = time.monotonic()
    world = prepare_world(out, cfg, args)
    indexes = {DEEP: world["index"], SHALLOW: world["index-shallow"]}
    train_tasks, eval_tasks = load_tasks([str(world["train"])]), load_tasks([str(world["eval"])])
    demo_tasks = warmup_tasks(world, train_tasks, args)
    # evaluations: greedy experts memoized too (one cache for all of them: the same prompt gets the
    # same reply it would get anyway); their latency is then the wall time of cache hits, not the tools'
    eval_runtime = routed_runtime(build_runtime(cfg), indexes)
    if not isinstance(eval_runtime.llm, MemoizedLLM):
        eval_runtime.llm = MemoizedLLM(eval_runtime.llm)
    judge = train_judge(cfg)
    stage("world", t0)
    t0 = time.monotonic()
    warm, taught = prepare_policy(out, cfg, eval_runtime, demo_tasks, args)
    stage("warm-up", t0)
    t0 = time.monotonic()
    initial = evaluate_all(warm, eval_tasks, eval_runtime, cfg, judge, args, out, "initial")
    stage("initial evaluation", t0)
    t0 = time.monotonic()
    run(cfg, runtime=routed_runtime(build_runtime(cfg), indexes))
    stage("GRPO", t0)
    t0 = time.monotonic()
    final_model = list_checkpoints(Path(cfg.run.dir) / "checkpoints")[-1] / "model"
    final = evaluate_all(final_model, eval_tasks, eval_runtime, cfg, judge, args, out, "final")
    stage("final evaluation", t0)

    result = checks(initial, final)
    png = plot(Path(cfg.run.dir) / "metrics.jsonl", initial[MAIN_PRESET], final[MAIN_PRESET], out)
    # top level: the foundation quickstart's four keys, for the trained (final) policy, main preset
    headline = {k: final[MAIN_PRESET][k] for k in ("accuracy", "cost_per_task", "latency_per_task", "tool_calls_per_task")}
    summary = {**headline, "seed": seed, "initial": initial, "final": final, "checks": result,
               "preference_scores": preference_scores(out), "favoured_alias": FAVOURED_ALIAS,
               "presets": {k: v[0] for k, v in PRESETS.items()}, "main_preset": MAIN_PRESET, "train_mix": TRAIN_MIX,
               "unseen_tools": UNSEEN_TOOLS, "eval_temperature": args.eval_temperature,
               "warmup_alias_distribution": {"source": args.alias_prior, "floor": args.alias_floor,
                                             "loss_weight": args.alias_weight,
                                             "per_tool": taught, "tool_spread": args.tool_spread,
                                             "spread_to": args.spread_to},
               "train_tasks": len(train_tasks), "eval_tasks": len(eval_tasks), "plot": png.name,
               "config": str(Path(cfg.run.dir) / "config.yaml"), "stage_seconds": stages,
               "machine": _machine_load(), "threads": cfg.run.threads,
               "wall_seconds": round(time.monotonic() - started, 1)}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    print_table(initial, final, result)
    return summary


def spread(summaries: list[dict]) -> dict:
    """Per-seed headline numbers, their min / mean / max, and whether every seed passed each check."""
    rows = [{"seed": s["seed"], "accuracy": [s["initial"][MAIN_PRESET]["accuracy"], s["final"][MAIN_PRESET]["accuracy"]],
             "cost_per_task": [s["initial"][MAIN_PRESET]["cost_per_task"], s["final"][MAIN_PRESET]["cost_per_task"]],
             **{k: s["checks"][k] for k in ("accuracy_gain", "cost_reduction")},
             "favour_share": [s["initial"]["favour"]["favoured_share"], s["final"]["favour"]["favoured_share"]],
             "checks_pass": all(v for v in s["checks"].values() if isinstance(v, bool))} for s in summaries]
    stats = {}
    for key in ("accuracy_gain", "cost_reduction"):
        values = [r[key] for r in rows]
        stats[key] = {"min": min(values), "mean": round(sum(values) / len(values), 4), "max": max(values)}
    names = [k for k, v in summaries[0]["checks"].items() if isinstance(v, bool)]
    return {"seeds": rows, "spread": stats, "all_seeds_pass": {k: all(s["checks"][k] for s in summaries) for k in names}}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.seeds == 1:
        summary = run_seed(args, args.seed, args.out)
    else:
        summaries = [run_seed(args, args.seed + k, args.out / f"seed-{args.seed + k}") for k in range(args.seeds)]
        summary = spread(summaries)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        table = Table(title=f"quickstart over {args.seeds} seeds ({MAIN_PRESET} preset)")
        for col in ("seed", "accuracy", "$ / task", "cost cut", f"{FAVOURED_ALIAS} share (favour)", "all checks"):
            table.add_column(col, justify="right")
        for r in summary["seeds"]:
            table.add_row(str(r["seed"]), "{:.2f} -> {:.2f}".format(*r["accuracy"]),
                          "{:.6f} -> {:.6f}".format(*r["cost_per_task"]), f"{-100 * r['cost_reduction']:+.0f}%",
                          "{:.2f} -> {:.2f}".format(*r["favour_share"]), str(r["checks_pass"]))
        console.print(table)
        console.print(f"spread: {summary['spread']}; every seed passes: {summary['all_seeds_pass']}")
    console.print(f"summary: {args.out / 'summary.json'}; per-preset trajectories: eval_<initial|final>_<preset>.jsonl")
    return 0
