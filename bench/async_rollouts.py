"""Asynchronous training on the GPU path: steps per hour, GPU busy fraction and staleness at
`algorithm.max_staleness` 0 (synchronous), 1 and 2, with heavy-tailed tool latency (issue 32 item 3).

    python bench/async_rollouts.py --staleness 0 --json /tmp/async-s0.json     # H200, one setting per call
    python bench/async_rollouts.py --staleness 1 --json /tmp/async-s1.json
    python bench/async_rollouts.py --staleness 2 --json /tmp/async-s2.json
    python bench/async_rollouts.py --staleness 1 2 3 --order completion --json /tmp/async-c.json  # AReaL's queue
    python bench/async_rollouts.py --summarize --workdir /tmp/async --json /tmp/async.json   # after a time limit
    python bench/async_rollouts.py --tiny --device cpu --tasks 2 --group 2 --turns 3 --steps 2 \
        --median 0.05 --p99 0.2                                                # checks the script (CPU)

The real trainer end to end (`training.session.run`: `LocalLearner`, the synchronous loop or
`async_train_loop`, per-turn samples, the PPO update with mini-batches of 16, bfloat16 autocast on
float32 weights), on:
- the Qwen3-0.6B shape (28 layers, hidden 1024, 16 / 8 heads) with random weights and a small BPE
  vocabulary (as bench/gpu_rollouts.py), saved to a temporary folder;
- `--tasks` x `--group` rollouts per step (16 x 8 = 128), up to `--turns` (8) turns each;
- every expert call sleeping a log-normal time: median `--median` s (1), 99th percentile `--p99` s
  (20), i.e. sigma = ln(p99 / median) / 2.326 (the paper's 8-96 s per call scaled down; PAPER.md §2);
- a policy with random weights writes no tool call, so each turn decodes `--tokens` tokens through
  the engine (the decode cost is real) and the episode then receives a scripted call
  (`ScriptedTurns`): `enhance_reasoning` (the slow expert), or with probability `--answer-prob` per
  turn (0.2) `answer` (ends the episode, also an expert call), drawn from the row's sampling seed so
  every setting sees the same episodes; the judge marks each answer right with probability 0.5.
Reported per setting: steps per hour (3600 / the mean wall time between consecutive steps' metrics
lines, after the first step, which compiles), GPU busy fraction (nvidia-smi utilization.gpu sampled every 0.5 s over those steps: the
share of time some kernel ran), the staleness histogram of the trained samples, the dropped count,
and the trainer's idle wait; the same figures over the steady window alone (`steady`: steps s + 2 to
total - s, between the start's burst and the end's drain; see `steady_window`).  Target (issue 32): >= 1.5x steps per hour at staleness 1 over 0,
GPU busy >= 80%.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from orchestrator.catalog import load_catalog  # noqa: E402
from orchestrator.engines.interface import Generation  # noqa: E402
from orchestrator.loop import Task, task_catalog  # noqa: E402
from orchestrator.records import LLMResponse, Usage  # noqa: E402
from orchestrator.toolcall import allowed_call_strings, format_tool_call  # noqa: E402

_catalog = load_catalog()
TOOLS = {name: {a: s.model for a, s in list(_catalog.tool(name).aliases.items())[:1]}
         for name in ("enhance_reasoning", "answer")}


class ScriptedTurns:
    """Runs the real engine call (its decode cost), then hands each row a scripted call: `answer`
    with probability `answer_prob` (seeded by the row's seed), else `enhance_reasoning`.  Keeps the
    inner generation's policy version; the behaviour log-probs are the inner ones, cut or padded to
    the call's length (a random policy's tokens are not the call's: only their cost is real)."""

    def __init__(self, engine, answer_prob: float):
        self.engine, self.tokenizer, self.answer_prob = engine, engine.tokenizer, answer_prob
        calls = {name: format_tool_call(name, {"model": next(iter(aliases))}) for name, aliases in TOOLS.items()}
        self.calls = {name: (text, self.tokenizer(text, add_special_tokens=False)["input_ids"])
                      for name, text in calls.items()}

    def generate(self, prompts, params, *, seeds=None, deadlines=None):
        real = self.engine.generate(prompts, params, seeds=seeds)
        out = []
        for k, gen in enumerate(real):
            seed = seeds[k] if seeds is not None and seeds[k] is not None else random.getrandbits(62)
            name = "answer" if random.Random(seed).random() < self.answer_prob else "enhance_reasoning"
            text, ids = self.calls[name]
            logprobs = (list(gen.logprobs) + [-1.0] * len(ids))[:len(ids)]
            out.append(Generation(token_ids=list(ids), logprobs=logprobs, text=text,
                                  policy_version=gen.policy_version))
        return out

    def update_weights(self, weights):
        self.engine.update_weights(weights)

    def close(self):
        getattr(self.engine, "close", lambda: None)()


def build_policy(folder: Path, tiny: bool, shape: str = "0.6b", dtype=None) -> Path:
    """A random-weight Qwen3 policy of `shape` (gpu_train_step.qwen3_config: "0.6b", "8b"; `tiny`: the
    script check's) with a tokenizer of the tool world's prompts and calls, saved to `folder`."""
    from gpu_train_step import qwen3_config
    from transformers import Qwen3ForCausalLM

    from training.tiny_policy import tiny_tokenizer

    catalog = task_catalog(_catalog, Task("x", "q", tools=TOOLS))
    texts = [json.dumps(catalog.openai_tools(tools=catalog.tools))] * 5
    texts += allowed_call_strings({t: list(a) for t, a in TOOLS.items()}) * 50
    texts += [(ROOT / "orchestrator/prompts" / f).read_text() * 5 for f in ("system.txt", "user.txt")]
    tok = tiny_tokenizer(texts, vocab_size=1200)
    cfg = qwen3_config(tiny, shape)
    cfg.vocab_size, cfg.eos_token_id, cfg.pad_token_id = len(tok), tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(dtype or torch.float32).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def lognormal_runtime(median: float, p99: float, seed: int):
    """A runtime whose every expert call sleeps log-normal(ln median, ln(p99 / median) / 2.326) s."""
    from orchestrator.settings import load_profile
    from orchestrator.setup import build_runtime

    sigma = math.log(p99 / median) / 2.3263
    rng, lock, drawn = random.Random(seed), threading.Lock(), []

    def llm(model, messages, **kw):
        with lock:
            seconds = rng.lognormvariate(math.log(median), sigma)
            drawn.append(seconds)
        time.sleep(seconds)
        return LLMResponse(model=model, text="```python\nprint(1)\n```  1", usage=Usage(100, 10))

    def run_code(code, timeout):
        from types import SimpleNamespace
        return SimpleNamespace(stdout="1\n", stderr="", exit_code=0, timed_out=False, duration_s=0.0)

    profile = load_profile("default")
    rt = build_runtime(profile, {"qa": profile.section("qa", "train")}, _catalog, llm=llm, run_code=run_code)
    return rt, drawn


class GpuBusy:
    """nvidia-smi utilization.gpu every `period` s in a thread: (time, percent) samples, each also
    appended to `path` as it comes (a run its call's time limit ends keeps them: `--summarize`)."""

    def __init__(self, period: float = 0.5, path: Path | None = None):
        self.samples: list[tuple[float, float]] = []
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5).stdout.strip()
                self.samples.append((time.time(), float(out.splitlines()[0])))
                if self.path is not None:
                    with self.path.open("a") as f:
                        f.write(f"{self.samples[-1][0]} {self.samples[-1][1]}\n")
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            time.sleep(period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)



def busy_mean(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    inside = [p for t, p in samples if start <= t <= end]
    return sum(inside) / len(inside) / 100 if inside else None


def read_busy(path: Path) -> list[tuple[float, float]]:
    if not path.exists():
        return []
    return [(float(a), float(b)) for a, b in (line.split() for line in path.read_text().splitlines() if line.strip())]


def trainer_busy(timed: list[dict], step_seconds: list[float]) -> float | None:
    """1 - (seconds the trainer waited for its rollouts) / (wall seconds of those steps): the
    synchronous loop waits for each step's whole rollout time, the asynchronous one `async/wait`."""
    if not step_seconds:
        return None
    waits = [m["async/wait"] if "async/wait" in m else m["time/rollout"] for m in timed]
    return 1 - sum(waits) / sum(step_seconds)


def run_setting(args, policy: Path, staleness: int, root: Path) -> dict:
    from training.config import load_config
    from training.learner import LocalLearner
    from training.session import run

    from orchestrator.engines.batcher import BatchingEngine

    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Compute item {i}.", "answer": "1",
                                         "tools": TOOLS}) + "\n" for i in range(args.tasks)))
    name = f"{'c' if args.order == 'completion' else 's'}{staleness}"
    over = {"run.dir": str(root / f"run-{name}"), "algorithm.async_order": args.order, "run.device": args.device, "run.resume": "never",
            "model.path": str(policy), "model.dtype": "bfloat16" if args.device.startswith("cuda") else "float32",
            "model.price_model": "Qwen3-8B", "engine.kind": "hf", "engine.max_batch": args.tasks * args.group,
            "data.train_files": f"[{tasks}]", "rollout.tasks_per_step": args.tasks,
            "rollout.rollouts_per_task": args.group, "rollout.max_turns": args.turns,
            "rollout.max_tokens": args.tokens, "rollout.context_tokens": args.context_tokens,
            "rollout.constrained": "false", "rollout.concurrency": args.tasks * args.group,
            "algorithm.max_staleness": staleness, "algorithm.micro_batch_size": args.micro_batch,
            "trainer.total_steps": args.steps, "trainer.save_every": 10_000, "logging.wandb": "disabled",
            "logging.console": "true", "optim.lr": "1e-6"}
    if staleness:
        over.update({"algorithm.old_logprobs": "engine", "engine.share_weights": "false"})
    cfg = load_config(None, [f"{k}={v}" for k, v in over.items()])
    runtime, drawn = lognormal_runtime(args.median, args.p99, seed=1)
    judge_rng, judge_lock = random.Random(2), threading.Lock()

    def judge(task, rollout):
        with judge_lock:
            return judge_rng.random() < 0.5

    def make_learner(*a):
        learner = LocalLearner(*a)
        learner.engine = BatchingEngine(ScriptedTurns(learner.engine.engine, args.answer_prob),
                                        max_batch=cfg.engine.max_batch, linger_ms=cfg.engine.linger_ms)
        return learner

    busy_file = Path(cfg.run.dir) / "gpu_busy.txt"
    busy_file.parent.mkdir(parents=True, exist_ok=True)
    busy_file.unlink(missing_ok=True)
    with GpuBusy(path=busy_file) as busy:
        run(cfg, runtime=runtime, judge=judge, make_learner=make_learner)
    return {**summarize(Path(cfg.run.dir), busy.samples, staleness, args.order if staleness else "-",
                        cfg.trainer.total_steps),
            "tool_calls": len(drawn), "tool_seconds_max": round(max(drawn), 1) if drawn else None}


def steady_window(staleness: int, total_steps: int) -> tuple[int, int]:
    """The steps (first, last; 1-based, inclusive) whose wall time shows the steady state: after the
    start's burst (while step 1 compiles and updates, batches 2 .. s + 1 are made in advance, so steps
    2 .. s + 1 find their groups ready) and before the end's drain (no batch after `total_steps` is
    admitted, so the last s steps train from a shrinking pool: their oldest groups done are the
    slowest ones).  A long training run has one burst and one drain; a short bench is mostly both."""
    return staleness + 2, total_steps - staleness


def window_figures(metrics: list[dict], busy: list[tuple[float, float]], first: int, last: int) -> dict | None:
    """Steps per hour, trainer busy and GPU busy over the periods ending at steps first .. last (None
    when the run logged no such period)."""
    by_step = {int(m["step"]): m for m in metrics}
    steps = [k for k in range(max(first, 2), last + 1) if k in by_step and k - 1 in by_step]
    if not steps:
        return None
    seconds = [by_step[k]["time"] - by_step[k - 1]["time"] for k in steps]
    return {"steps": [steps[0], steps[-1]], "steps_per_hour": 3600 / (sum(seconds) / len(seconds)),
            "trainer_busy": trainer_busy([by_step[k] for k in steps], seconds),
            "gpu_busy": busy_mean(busy, by_step[steps[0] - 1]["time"], by_step[steps[-1]]["time"])}


def summarize(run_dir: Path, busy: list[tuple[float, float]], staleness: int, order: str,
              total_steps: int | None = None) -> dict:
    """One setting's figures from its run folder's metrics.jsonl (written a step at a time) and the
    GPU-busy samples: over every step after the first, and over the steady window (`steady_window`;
    `total_steps`: the run's trainer.total_steps, default the steps logged)."""
    from training.metrics_log import read_metrics

    metrics = read_metrics(run_dir / "metrics.jsonl")
    steady = window_figures(metrics, busy, *steady_window(staleness, total_steps or len(metrics)))
    every = window_figures(metrics, busy, 2, len(metrics)) or {"steps_per_hour": None, "trainer_busy": None,
                                                               "gpu_busy": None}   # the first step compiles
    timed = metrics[1:]
    # the wall time between consecutive steps' logs (both loops: everything a step costs)
    step_seconds = [b["time"] - a["time"] for a, b in zip(metrics, metrics[1:])]
    hist = {d: int(sum(m.get(f"async/staleness_{d}", 0) for m in timed)) for d in range(staleness + 1)}
    if not staleness:
        hist = {0: int(sum(m["train/samples"] for m in timed))}
    return {"staleness": staleness, "order": order, "steps_measured": len(timed),
            "step_seconds": step_seconds, "trainer_busy": every["trainer_busy"],
            "steps_per_hour": every["steps_per_hour"], "gpu_busy": every["gpu_busy"],
            "steady": steady,
            "staleness_histogram": hist,
            "dropped_stale": int(sum(m.get("async/dropped_stale", 0) for m in timed)),
            "groups_of_other_batches": int(sum(m.get("async/groups_of_other_batches", 0) for m in timed)),
            "trainer_wait_s": [round(m.get("async/wait", 0.0), 2) for m in timed],
            "rollout_s": [round(m["time/rollout"], 1) for m in timed],
            "samples_per_step": [m["train/samples"] for m in timed],
            "turns_per_rollout": [round(m["rollout/turns"], 2) for m in timed]}


def summarize_workdir(workdir: Path) -> list[dict]:
    """Every run-* folder of a --workdir, finished or ended by a time limit (its config.yaml, read as
    training reads a config, names the setting; the steps logged before the end are counted)."""
    from training.config import load_config

    out = []
    for run_dir in sorted(workdir.glob("run-*")):
        if not (run_dir / "metrics.jsonl").exists() or not (run_dir / "config.yaml").exists():
            continue
        cfg = load_config(run_dir / "config.yaml")
        s = cfg.algorithm.max_staleness
        out.append(summarize(run_dir, read_busy(run_dir / "gpu_busy.txt"), s,
                             cfg.algorithm.async_order if s else "-", cfg.trainer.total_steps))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--order", choices=["batch", "completion"], default="batch",
                        help="algorithm.async_order for the asynchronous settings")
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen3 config (checks the script)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="decoded tokens per turn")
    parser.add_argument("--answer-prob", type=float, default=0.2)
    parser.add_argument("--median", type=float, default=1.0, help="tool latency median, seconds")
    parser.add_argument("--p99", type=float, default=20.0, help="tool latency 99th percentile, seconds")
    parser.add_argument("--steps", type=int, default=5, help="training steps per setting (the first is not timed)")
    parser.add_argument("--context-tokens", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the policy and each setting's run folder (metrics.jsonl) "
                                                    "here (default: a temporary folder)")
    parser.add_argument("--summarize", action="store_true",
                        help="only summarise the run-* folders of --workdir (e.g. after a time limit ended the bench)")
    args = parser.parse_args()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__, "settings": []}
    if args.summarize:
        if not args.workdir:
            parser.error("--summarize needs --workdir (the folder the bench ran in)")
        results["settings"] = summarize_workdir(args.workdir)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        print_table(results["settings"])
        return 0
    if args.device.startswith("cuda"):
        results["card"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        if args.workdir:
            args.workdir.mkdir(parents=True, exist_ok=True)
            tmp = str(args.workdir)
        policy = build_policy(Path(tmp) / "policy", args.tiny)
        for s in args.staleness:
            r = run_setting(args, policy, s, Path(tmp))
            results["settings"].append(r)
            print(json.dumps(r), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print_table(results["settings"])
    return 0


def print_table(settings: list[dict]) -> None:
    base = next((r["steps_per_hour"] for r in settings if r["staleness"] == 0), None)
    for r in settings:
        if r["steps_per_hour"] is None:
            print(f"staleness {r['staleness']} ({r['order']} order): fewer than two steps logged")
            continue
        speed = f"{r['steps_per_hour'] / base:.2f}x" if base and r["steps_per_hour"] else "-"
        busy = f"{r['gpu_busy']:.0%}" if r["gpu_busy"] is not None else "-"
        trainer = f"{r['trainer_busy']:.0%}" if r["trainer_busy"] is not None else "-"
        print(f"staleness {r['staleness']} ({r['order']} order): {r['steps_per_hour']:.1f} steps/h ({speed} of "
              f"staleness 0), GPU busy {busy}, trainer busy {trainer}, staleness histogram "
              f"{r['staleness_histogram']}, dropped {r['dropped_stale']}, groups of other batches "
              f"{r['groups_of_other_batches']}")
        w = r.get("steady")
        if w:
            wb = f"{w['gpu_busy']:.0%}" if w["gpu_busy"] is not None else "-"
            print(f"  steady (steps {w['steps'][0]}-{w['steps'][1]}): {w['steps_per_hour']:.1f} steps/h, GPU busy "
                  f"{wb}, trainer busy {w['trainer_busy']:.0%}")
        else:
            print("  steady: no step between the start's burst and the end's drain (run more steps: "
                  "2 x staleness + 2 at least)")


if __name__ == "__main__":
    raise SystemExit(main())
