"""`make quickstart`: the learning quickstart: GRPO visibly teaches a small orchestrator, on CPU.

    python -m training.quickstart [--out runs/quickstart] [--seed 0] [--seeds N | --seeds 0,2,4] [key=value ...]
    python -m training.quickstart --recompute RUN_DIR     # the intervals again, from the saved trajectories

Stages (each printed with its wall time):
  1. world: corpus + train / held-out tasks + a MiniLM/FAISS index (training/quickstart/env.py);
     preferences stated in varied words, `favour` naming the favoured answer alias (`--favour-aliases`);
  2. policy: a tiny random Llama with SmolLM2's tokenizer, warmed up on demonstrations that pick
     aliases as the prompted SmolLM2 does and the alias a favour line names (warm_start.py, warmup.py);
  3. initial evaluation on 64 held-out tasks under each preference in its training words, in a
     paraphrase training never showed, and under the unseen catalog (greedy experts memoized);
  4. GRPO with training/configs/quickstart.yaml (`python training/train.py` does the same);
  5. final evaluation on the same held-out tasks, with the same sampling seeds;
  6. summary.json (`initial` and `final`: accuracy, cost_per_task $, latency_per_task s,
     tool_calls_per_task per alias; `intervals`: each check's estimate and 95% paired-bootstrap
     interval over the held-out tasks, training/quickstart/stats.py; `checks`) and
     training_curves.png (reward, accuracy, cost per step); machine.py: the machine it ran on.

Trailing `key=value` arguments override the trainer config (e.g. trainer.total_steps=20).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from orchestrator.context import Budgets
from orchestrator.loop import Task
from training.checkpoint import list_checkpoints
from training.config import TrainConfig, load_config
from training.quickstart.beside import Beside
from training.quickstart.cli import _args, seeds_to_run
from training.quickstart.env import (
    ANSWER_ALIASES,
    DEEP,
    FAVOURED_ALIAS,
    MAIN_PRESET,
    PARAPHRASES,
    PRESETS,
    SHALLOW,
    TRAIN_MIX,
    UNSEEN_TOOLS,
    WORDINGS,
    build_index,
    build_world,
    evaluation_runtime,
    quickstart_catalog,
    routed_runtime,
    with_preference,
)
from training.quickstart.machine import machine_load
from training.quickstart.report import (
    console,
    plot,
    print_checks,
    print_seeds,
    print_table,
)
from training.quickstart.stats import (
    TaskOutcome,
    accuracy_check,
    accuracy_gain,
    cost_check,
    cost_ratio,
    does_not_rise,
    rises,
    share_rise,
)
from training.quickstart.warm_start import prepare_policy, warmup_tasks
from training.rollouts import collect_rollouts
from training.tasks import load_tasks

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
EVAL_STEP = 1_000_000          # sampling seeds of the evaluations (same for initial and final)


def _paths_overrides(out: Path) -> list[str]:
    """Point the trainer config at this output folder (the YAML's defaults assume runs/quickstart)."""
    world = out / "world"
    return [f"run.dir={out / 'train'}", f"model.path={out / 'policy-warm'}",
            f"data.train_files=[{world / 'train.jsonl'}]", f"tools.catalog={world / 'tools.json'}",
            f"tools.index={world / 'index'}"]


def prepare_world(out: Path, cfg: TrainConfig, args) -> dict[str, Path]:
    paths = build_world(out / "world", n_train=args.train_tasks, n_eval=args.eval_tasks,
                        n_warmup=args.warmup_tasks, seed=cfg.run.seed, favour_aliases=args.favour_aliases,
                        balanced_kinds=args.balanced_kinds)
    quickstart_catalog(out / "world")
    paths["index"] = build_index(paths["corpus"], out / "world" / "index")
    paths["index-shallow"] = build_index(paths["places"], out / "world" / "index-shallow")
    return paths


def read_favour_line(model_dir: Path, eval_tasks: list[Task], runtime, cfg: TrainConfig) -> dict[str, float]:
    """`reading.favour_reading` on the first 16 held-out tasks, printed."""
    from training.quickstart.reading import favour_reading

    reading = favour_reading(model_dir, eval_tasks[:16], runtime, topk=runtime.qa.retrieval.topk,
                             budgets=Budgets(context_tokens=cfg.rollout.context_tokens), device=cfg.run.device)
    console.print(f"reading the favour line ({model_dir.name}): P({FAVOURED_ALIAS}) at the answer alias "
                  + ", ".join(f"{k} {v:.2f}" for k, v in reading.items()))
    return reading


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
                                "preference_name": task.metadata.get("preference_name"),
                                "favoured": task.metadata.get("favoured", FAVOURED_ALIAS),
                                "wording": task.metadata.get("wording", 0), **_strip_tokens(r)}) + "\n")
    return {**summarise(rollouts, correct), **favoured_shares(rollouts)}


def favoured_shares(rollouts) -> dict:
    """The favoured alias's share of its own tool's calls (`favoured_share`: the choice among the
    answer aliases; a share of all calls would also move when the policy makes fewer or more calls
    of other tools), and among all calls (`favoured_share_of_calls`)."""
    def share(aliases) -> float:
        mine = sum(r.tool_calls.get(FAVOURED_ALIAS, 0) for r in rollouts)
        return mine / max(1e-9, sum(n for r in rollouts for a, n in r.tool_calls.items() if aliases is None or a in aliases))

    return {"favoured_share": share(set(ANSWER_ALIASES)), "favoured_share_of_calls": share(None)}


EVAL_RUNS = ("accuracy", "cost", "favour", "accuracy_paraphrase", "cost_paraphrase", "favour_paraphrase",
             "unseen_tools")


def eval_runs(tasks: list[Task]) -> dict[str, list[Task]]:
    """The held-out evaluations: the same tasks under each preference in its training words
    (the tasks take the wordings in turn; `favour` names FAVOURED_ALIAS), under each preference's
    paraphrase that training never showed (`<preset>_paraphrase`), and under the unseen catalog
    (main preset)."""
    runs = {name: [with_preference(t, name, wording=i % len(WORDINGS[name])) for i, t in enumerate(tasks)]
            for name in PRESETS}
    runs.update({f"{name}_paraphrase": [with_preference(t, name, wording="paraphrase") for t in tasks]
                 for name in PRESETS})
    runs["unseen_tools"] = [with_preference(t, MAIN_PRESET, tools=UNSEEN_TOOLS) for t in tasks]
    return {name: runs[name] for name in EVAL_RUNS}


def evaluate_all(model_dir: Path, tasks: list[Task], runtime, cfg: TrainConfig, judge, args, out: Path,
                 tag: str, names: tuple[str, ...] = EVAL_RUNS) -> dict:
    """The policy on the same held-out tasks under the runs `names` of `eval_runs` (default: all):
    {run: summary}; trajectories to out/eval_<tag>_<run>.jsonl.  Each run samples from its own
    seed, so which runs share a process, and in what order, changes no trajectory."""
    return {name: evaluate(model_dir, ts, runtime, cfg, judge, args.eval_temperature, args.eval_concurrency,
                           out / f"eval_{tag}_{name}.jsonl", args.eval_samples)
            for name, ts in eval_runs(tasks).items() if name in names}


def task_outcomes(path: Path) -> list[TaskOutcome]:
    """One `TaskOutcome` per held-out task from a saved trajectory file (a task's episodes are
    consecutive lines with its task_id): episodes, correct ones, dollars, answer calls, and the
    calls of the alias the task's line favours (answer-4 on the held-out tasks)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    answer = set(ANSWER_ALIASES)
    return [TaskOutcome(episodes=len(rs), correct=sum(bool(r["correct"]) for r in rs), cost=sum(r["cost"] for r in rs),
                        answer_calls=sum(n for r in rs for a, n in r["tool_calls"].items() if a in answer),
                        favoured_calls=sum(r["tool_calls"].get(r.get("favoured") or FAVOURED_ALIAS, 0) for r in rs))
            for rs in by_task.values()]


def intervals(out: Path) -> dict:
    """Every check's estimate and 95% paired-bootstrap interval (training/quickstart/stats.py),
    recomputed from the saved held-out trajectories eval_<initial|final>_<run>.jsonl in `out`:
    the accuracy gain and the after/before cost ratio under MAIN_PRESET, and the rise of the
    favoured alias's share of the answer calls under each preference and paraphrase."""
    def pair(name):
        before, after = (task_outcomes(out / f"eval_{tag}_{name}.jsonl") for tag in ("initial", "final"))
        return before, after

    result = {"accuracy_gain": accuracy_gain(*pair(MAIN_PRESET)), "cost_ratio": cost_ratio(*pair(MAIN_PRESET))}
    for name in EVAL_RUNS:
        if name != "unseen_tools":
            result[f"share_rise_{name}"] = share_rise(*pair(name))
    return result


def checks(ci: dict) -> dict:
    """The quickstart's four claims, each from its interval (issue 43; thresholds in stats.py):
    under MAIN_PRESET the accuracy gain >= 5 points with its lower bound > 0 and the cost cut >= 40%
    with the after/before ratio's upper bound < 1; the favoured alias's share of the answer calls
    rises under `favour` (lower bound > 0) in the training words *and* in the unseen paraphrase;
    and does not rise under `accuracy` or `cost` (upper bound <= the interval's width), in their
    training words *and* their paraphrases: a policy that gives any unfamiliar sentence to the
    favoured alias has not read the favour paraphrase (issue 43 part 3)."""
    return {"accuracy_up_5_points": accuracy_check(ci["accuracy_gain"]),
            "cost_at_least_40pct_lower": cost_check(ci["cost_ratio"]),
            "favoured_share_rises_when_favoured": rises(ci["share_rise_favour"])
            and rises(ci["share_rise_favour_paraphrase"]),
            "favoured_share_not_rising_otherwise": all(does_not_rise(ci[f"share_rise_{p}{words}"])
                                                       for p in PRESETS if p != "favour"
                                                       for words in ("", "_paraphrase"))}


def recompute(run_dir: Path) -> int:
    """`--recompute RUN_DIR`: the intervals and checks again from RUN_DIR's saved trajectories,
    compared with its summary.json; exit status 1 where they differ."""
    summary_path = run_dir / "summary.json"
    try:
        saved = json.loads(summary_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        console.print(f"--recompute {run_dir}: cannot read summary.json ({exc})")
        return 2
    ci = intervals(run_dir)
    got = {"intervals": ci, "checks": checks(ci)}
    same = got["intervals"] == saved.get("intervals") and got["checks"] == saved.get("checks")
    print_checks(ci, got["checks"])
    console.print(f"recomputed from {run_dir}/eval_*.jsonl: "
                  + ("identical to summary.json" if same else "DIFFERENT from summary.json"))
    return 0 if same else 1


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


def evaluation_process(args, cfg: TrainConfig, indexes: dict[str, Path], model_dir: Path, eval_tasks: list[Task],
                       out: Path, replies: dict, tag: str, names: tuple[str, ...]) -> tuple[dict, dict, float]:
    """`evaluate_all(model_dir, ..., tag, names)` as a second process's work (the initial evaluation
    beside GRPO, half the final one beside the other half), its memo started from `replies`, its
    output to out/eval_<tag>.log: (summaries, the expert replies memoized, seconds)."""
    import contextlib

    import torch

    from training.session import train_judge

    t0 = time.monotonic()
    with (out / f"eval_{tag}.log").open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        runtime = evaluation_runtime(cfg, indexes)
        runtime.llm.preload(replies)
        summaries = evaluate_all(model_dir, eval_tasks, runtime, cfg, train_judge(cfg), args, out, tag, names)
    return summaries, runtime.llm.entries(), round(time.monotonic() - t0, 1)


def final_evaluation(args, cfg: TrainConfig, indexes: dict[str, Path], model_dir: Path, eval_tasks: list[Task],
                     eval_runtime, out: Path) -> dict:
    """`evaluate_all(model_dir, ..., "final")`: with `--parallel-eval` the last three runs of
    EVAL_RUNS go to a second (spawned) process beside the first four here (one thread each: a
    2-core box evaluates on both cores), with the same trajectories as in turn."""
    from training.session import train_judge

    if not args.parallel_eval:
        return evaluate_all(model_dir, eval_tasks, eval_runtime, cfg, train_judge(cfg), args, out, "final")
    here, there = EVAL_RUNS[:4], EVAL_RUNS[4:]
    beside = Beside(evaluation_process, args, cfg, indexes, model_dir, eval_tasks, out, eval_runtime.llm.entries(),
                    "final", there, what=f"the final evaluation's second process (log: {out / 'eval_final.log'})")
    try:
        mine = evaluate_all(model_dir, eval_tasks, eval_runtime, cfg, train_judge(cfg), args, out, "final", here)
        theirs = beside.result()[0]
    finally:
        beside.stop()       # this half failed: the other is of no use (else it has ended)
    return {name: (mine | theirs)[name] for name in EVAL_RUNS}


def evaluate_initial_and_train(args, cfg: TrainConfig, indexes: dict[str, Path], warm: Path, eval_tasks: list[Task],
                               eval_runtime, out: Path) -> tuple[dict, dict[str, float]]:
    """The initial evaluation and GRPO, both from the warm policy: with `--parallel-eval` the
    evaluation runs in a second (spawned) process beside GRPO, each on its own `run.threads`, so a
    2-core box does both at once; its memoized expert replies then join `eval_runtime`'s (the final
    evaluation's cache hits, as if it had run here).  Greedy experts and seeded sampling make the
    trajectories the same either way; latencies differ.  Returns (initial summaries, seconds of each)."""
    from training.session import build_runtime, run, train_judge

    seconds, beside = {}, None
    if args.parallel_eval:
        beside = Beside(evaluation_process, args, cfg, indexes, warm, eval_tasks, out, eval_runtime.llm.entries(),
                        "initial", EVAL_RUNS, what=f"the initial evaluation's process (log: {out / 'eval_initial.log'})")
        console.print(f"initial evaluation: in a second process beside GRPO (log: {out / 'eval_initial.log'})")
    else:
        t0 = time.monotonic()
        initial = evaluate_all(warm, eval_tasks, eval_runtime, cfg, train_judge(cfg), args, out, "initial")
        seconds["initial evaluation"] = round(time.monotonic() - t0, 1)
    try:
        t0 = time.monotonic()
        run(cfg, runtime=routed_runtime(build_runtime(cfg), indexes))
        seconds["GRPO"] = round(time.monotonic() - t0, 1)
        if beside is not None:
            initial, replies, seconds["initial evaluation"] = beside.result()
            eval_runtime.llm.preload(replies)
    finally:
        if beside is not None:
            beside.stop()       # GRPO failed: the evaluation is of no use (else it has ended)
    return initial, seconds


def run_seed(args, seed: int, out: Path) -> dict:
    """The whole quickstart for one seed under `out`; returns its summary (also out/summary.json)."""
    started, stages = time.monotonic(), {}
    cfg = load_config(CONFIG, _paths_overrides(out) + [f"run.seed={seed}", f"run.device={args.device}"]
                      + list(args.overrides))
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
    eval_runtime = evaluation_runtime(cfg, indexes)
    stage("world", t0)
    t0 = time.monotonic()
    warm, warmup = prepare_policy(out, cfg, eval_runtime, demo_tasks, args, indexes)
    reading = {"warm": read_favour_line(warm, eval_tasks, eval_runtime, cfg)}
    stage("warm-up", t0)
    if args.warmup_only:
        summary = {"seed": seed, "reading": reading, "warmup_tries": warmup["tries"], "stage_seconds": stages,
                   "machine": machine_load()}
        (out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    initial, seconds = evaluate_initial_and_train(args, cfg, indexes, warm, eval_tasks, eval_runtime, out)
    for name in ("initial evaluation", "GRPO"):
        stages[name] = seconds[name]
        console.print(f"[bold]seed {seed}: {name}[/]: {stages[name]} s")
    t0 = time.monotonic()
    final_model = list_checkpoints(Path(cfg.run.dir) / "checkpoints")[-1] / "model"
    final = final_evaluation(args, cfg, indexes, final_model, eval_tasks, eval_runtime, out)
    reading["final"] = read_favour_line(final_model, eval_tasks, eval_runtime, cfg)
    stage("final evaluation", t0)

    ci = intervals(out)
    result = checks(ci)
    png = plot(Path(cfg.run.dir) / "metrics.jsonl", initial[MAIN_PRESET], final[MAIN_PRESET], out)
    # top level: the foundation quickstart's four keys, for the trained (final) policy, main preset
    headline = {k: final[MAIN_PRESET][k] for k in ("accuracy", "cost_per_task", "latency_per_task", "tool_calls_per_task")}
    summary = {**headline, "seed": seed, "initial": initial, "final": final, "checks": result, "intervals": ci,
               "checks_holding": f"{sum(result.values())} of {len(result)}", "reading": reading,
               "warmup_tries": warmup["tries"],
               "preference_scores": preference_scores(out), "favoured_alias": FAVOURED_ALIAS,
               "presets": {k: v[0] for k, v in PRESETS.items()}, "wordings": WORDINGS, "paraphrases": PARAPHRASES,
               "main_preset": MAIN_PRESET, "train_mix": TRAIN_MIX,
               "unseen_tools": UNSEEN_TOOLS, "eval_temperature": args.eval_temperature,
               "warmup_alias_distribution": {"source": args.alias_prior, "floor": args.alias_floor,
                                             "search_floor": args.search_alias_floor,
                                             "loss_weight": args.alias_weight,
                                             "per_tool": warmup["taught"], "tool_spread": args.tool_spread,
                                             "spread_to": args.spread_to},
               "train_tasks": len(train_tasks), "eval_tasks": len(eval_tasks), "plot": png.name,
               "config": str(Path(cfg.run.dir) / "config.yaml"), "stage_seconds": stages,
               "machine": machine_load(), "threads": cfg.run.threads,
               "flags": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                         "seeds": seeds_to_run(args)},           # resolved (the parser marks a count negative)
               "wall_seconds": round(time.monotonic() - started, 1)}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    print_table(initial, final, ci, result)
    return summary


def spread(summaries: list[dict]) -> dict:
    """Per-seed headline numbers with their intervals, and whether every seed passed each check."""
    rows = [{"seed": s["seed"], "accuracy": [s["initial"][MAIN_PRESET]["accuracy"], s["final"][MAIN_PRESET]["accuracy"]],
             "cost_per_task": [s["initial"][MAIN_PRESET]["cost_per_task"], s["final"][MAIN_PRESET]["cost_per_task"]],
             "accuracy_gain": s["intervals"]["accuracy_gain"], "cost_ratio": s["intervals"]["cost_ratio"],
             "favour_share": [s["initial"]["favour"]["favoured_share"], s["final"]["favour"]["favoured_share"]],
             "checks_holding": sum(s["checks"].values()), "checks_pass": all(s["checks"].values())} for s in summaries]
    names = list(summaries[0]["checks"])
    return {"seeds": rows, "all_seeds_pass": {k: all(s["checks"][k] for s in summaries) for k in names}}


def hide_gpus_for_a_cpu_run(device: str, environ=os.environ) -> None:
    """`--device cpu`: every stage on the CPU, the world's retrieval encoder included (the searcher
    and the index build pick a GPU wherever one is present, and encode with torch there instead of
    ONNX), so a CPU run on a GPU host is the same run as on a CPU box."""
    if device == "cpu":
        environ["CUDA_VISIBLE_DEVICES"] = ""


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.recompute is not None:
        return recompute(args.recompute)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hide_gpus_for_a_cpu_run(args.device)
    seeds = seeds_to_run(args)
    if args.warmup_only:
        for seed in seeds:
            run_seed(args, seed, args.out if len(seeds) == 1 else args.out / f"seed-{seed}")
        console.print(f"warm-up only: {args.out}/**/warmup.json (the favour line's reading per seed)")
        return 0
    if len(seeds) == 1:
        summary = run_seed(args, seeds[0], args.out)
    else:
        summaries = [run_seed(args, seed, args.out / f"seed-{seed}") for seed in seeds]
        summary = spread(summaries)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print_seeds(summary)
    console.print(f"summary: {args.out / 'summary.json'}; per-preference trajectories: eval_<initial|final>_<run>.jsonl")
    return 0
