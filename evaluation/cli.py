"""What run_hle.py, run_frames.py and run_tau2.py share: flags, the run folder, the endpoint.

A run folder holds `results.jsonl` (one record per task), `run_config.json` (the resolved
settings), and after the run `summary.json`, `viewer.html` and `cost_accuracy.png`.  One process
owns it at a time (`claim_output`: a lock on its `.lock` file), and it holds one benchmark's run:
another benchmark's run is refused in it, whatever the flags.
`--resume` continues a run only with the settings it was started with: every key of
run_config.json but the few in NOT_COMPARED (what is run, not how) must be equal, else the
resume is refused naming each difference; `--resume --force` continues anyway and writes the
differences to the run's log, `run.log`, one line per start.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
# run_config.json keys that may change on --resume: which tasks run, how fast, provenance.
# Every other key (models, profile, judge and prompt hashes, catalog hash, budgets, decoding,
# retrieval) changes what a record means, so a resume must keep it.  tau2's `num_trials` says
# which (task, trial) pairs run, like `task_ids`: trial t's seed is drawn from the run's seed
# whatever the number of trials (evaluation/tau2_metrics.py `trial_seeds`), so a record means the
# same under any k; raising it on --resume runs only the new trials.
NOT_COMPARED = ("git_commit", "tasks_loaded", "skipped", "malformed", "task_ids", "concurrency", "setting",
                "num_trials", "endpoints")   # endpoints: where each model is served (replicas move)
RUN_LOG = "run.log"
OUTPUT_LOCK = ".lock"      # flock'ed by the process that owns the run folder; holds its pid


class CLIError(ValueError):
    """A bad flag or run folder; printed as one line naming the flag and the fix."""


def add_common_args(parser: argparse.ArgumentParser, default_model: str = "smollm2-135m") -> None:
    g = parser.add_argument_group("orchestrator")
    g.add_argument("--model", default=default_model,
                   help="orchestrator model: a name in configs/models.yaml (default: %(default)s)")
    g.add_argument("--price-model", help="its row in tools.json 'prices' (default: the registry entry's "
                                         "price_model, else --model)")
    g.add_argument("--endpoint", help="serve --model from this OpenAI-compatible URL (e.g. http://host:8000/v1) "
                                      "instead of its registry entry")
    g.add_argument("--endpoint-model", help="model id the --endpoint server expects (default: --model)")
    g.add_argument("--temperature", type=float, default=0.6, help="orchestrator sampling temperature "
                                                                 "(paper: 0.6 for evaluation)")
    g.add_argument("--max-tokens", type=int, default=1024, help="completion tokens per orchestrator turn")
    g.add_argument("--max-turns", type=int, default=50, help="turn cap per task (paper: 50 in evaluation)")
    t = parser.add_argument_group("tools")
    t.add_argument("--tools", type=Path, help="tools.json (default: the repository's)")
    t.add_argument("--profile", help="settings profile: a configs/profiles/ name (default, paper, local, ...) or a "
                                     "YAML path; budgets, prompts, experts, judge and retrieval come from it")
    t.add_argument("--serve", help="tools.json serving map (which model answers for each alias model, e.g. local); "
                                   "default: the profile's `serve`")
    t.add_argument("--prompts", type=Path, help="folder of prompt files overriding orchestrator/prompts/")
    t.add_argument("--catalog", type=Path, help="unseen-tools evaluation (PAPER.md §9): this tools.json instead of "
                                                "--tools, refused unless it offers an alias model the training catalog "
                                                "never offers through that tool; run_config.json lists them")
    t.add_argument("--training-catalog", type=Path, help="the tools.json training drew its tools from, for the "
                                                         "unseen-tools list (default: the repository's)")
    t.add_argument("--preference", help="state a preference to the orchestrator as training does: a preset (accuracy, "
                                        "cost, latency, balanced, avoid_tool:TOOL, prefer_alias:ALIAS, "
                                        "avoid_alias:ALIAS) or a vector, e.g. accuracy=1,cost=0.5 or JSON")
    r = parser.add_argument_group("run")
    r.add_argument("--limit", type=int, help="run only the first N tasks")
    r.add_argument("--concurrency", type=int, default=16, help="tasks in flight at once (default: %(default)s)")
    r.add_argument("--output", type=Path, help="run folder (default: runs/<benchmark>-<model>-<mode>)")
    r.add_argument("--resume", action="store_true", help="continue the run in --output, skipping finished tasks")
    r.add_argument("--force", action="store_true", help="with --resume: continue although settings changed "
                                                         "(each change is written to the run's run.log)")
    r.add_argument("--retry-errors", action="store_true", help="with --resume: run the tasks that ended in error again")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--no-report", action="store_true", help="skip the report at the end")


def check_common(args: argparse.Namespace) -> None:
    for flag, value, low in (("--concurrency", args.concurrency, 1), ("--max-turns", args.max_turns, 1),
                             ("--max-tokens", args.max_tokens, 1), ("--limit", args.limit, 1)):
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    if args.force and not args.resume:
        raise CLIError("--force needs --resume (it continues a run whose settings changed)")
    if args.retry_errors and not args.resume:
        raise CLIError("--retry-errors needs --resume (it re-runs the error records of an existing run)")
    if args.endpoint_model and not args.endpoint:
        raise CLIError("--endpoint-model needs --endpoint")
    for flag in ("tools", "prompts"):
        path = getattr(args, flag)
        if path is not None and not path.exists():
            raise CLIError(f"--{flag} {path}: no such {'file' if flag == 'tools' else 'folder'}")
    catalog, training = getattr(args, "catalog", None), getattr(args, "training_catalog", None)
    if catalog is not None:   # --catalog is --tools declared unseen (evaluation/preference.py checks it)
        if args.tools is not None:
            raise CLIError("--catalog and --tools both name the run's catalog; give one (--catalog: an unseen-tools "
                           "evaluation, checked against --training-catalog)")
        args.tools = catalog
    for flag, path in (("--catalog", catalog), ("--training-catalog", training)):
        if path is not None and not path.exists():
            raise CLIError(f"{flag} {path}: no such file")


def use_endpoint(args: argparse.Namespace, out_dir: Path, price_model: str) -> None:
    """Serve --model from --endpoint: a copy of the registry with that one entry replaced.

    The copy lives in the run folder and $TOOLORCHESTRA_MODELS points at it for this
    process, so every other model still resolves as configured.
    """
    import yaml

    from orchestrator.gateway.registry import load_registry, registry_path

    base = load_registry()
    data = {"models": {name: e.model_dump(mode="json", exclude_none=True) for name, e in base.models.items()}}
    data["models"][args.model] = {"backend": "vllm", "model": args.endpoint_model or args.model,
                                  "base_url": args.endpoint, "price_model": price_model}
    if args.model in base.models:   # keep what the model accepts (e.g. its context window)
        data["models"][args.model]["rules"] = base.models[args.model].rules.model_dump(mode="json")
    path = out_dir / "models.yaml"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"# {registry_path()} with {args.model} served from {args.endpoint} (--endpoint)\n"
                   + yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)
    os.environ["TOOLORCHESTRA_MODELS"] = str(path)


def resolve_price_model(args: argparse.Namespace, catalog) -> str:
    """--price-model, else the registry entry's price_model, else --model; must be priced."""
    price_model = args.price_model
    if price_model is None and not args.endpoint:
        from orchestrator.gateway.registry import load_registry

        try:
            price_model = load_registry().entry(args.model).price_model
        except Exception as exc:  # unknown model / bad registry: say so with the gateway's message
            raise CLIError(f"--model {args.model}: {exc}") from None
    price_model = price_model or args.model
    if price_model not in catalog.prices:
        raise CLIError(f"--price-model {price_model!r} has no row in the tools.json price table; "
                       f"pass one of {sorted(catalog.prices)} or add it to 'prices'")
    return price_model


def load_run_profile(args):
    """The settings profile `--profile` names (orchestrator/settings.py); `args.serve` is set to the
    serving map the run uses (--serve, else the profile's) and `args.pricing` to the profile's
    `pricing` (whose price its expert calls pay)."""
    from orchestrator.settings import ProfileError, load_profile

    try:
        profile = load_profile(args.profile or "default")
    except ProfileError as exc:
        raise CLIError(f"--profile {args.profile}: {exc}") from None
    if getattr(args, "serve", None) is None:
        args.serve = profile.serve
    args.pricing = profile.pricing
    return profile


def check_serve(catalog, serve: str | None, tools: Path | None, pricing: str) -> None:
    """The serving map (--serve or the profile's) must be in tools.json and serve every alias with
    a model of the registry, priced as the profile's `pricing` needs.

    Without one nothing is checked here: each alias model is called as itself and a
    missing key or server fails that call, recorded per turn.
    """
    if not serve:
        return
    if serve not in catalog.profiles:
        raise CLIError(f"--serve {serve!r}: not in tools.json profiles {sorted(catalog.profiles)}")
    from orchestrator.gateway.registry import load_registry
    from orchestrator.runtime import check_pricing

    catalog.check_served(load_registry().models, serve, source=str(tools or "tools.json"))
    try:
        check_pricing(catalog, serve, pricing)
    except ValueError as exc:
        raise CLIError(f"the profile's {exc}") from None


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def content_hash(obj: Any) -> str:
    """sha256 of a JSON-able value (canonical: sorted keys), or of a str as is."""
    text = obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def index_fingerprint(index: Path) -> str | None:
    """What an index folder was built from and how (its build state and meta, corpus by content)."""
    parts = {}
    for name in ("build_state.json", "meta.json"):
        path = Path(index) / name
        if path.exists():
            data = json.loads(path.read_text())
            if isinstance(data.get("corpus"), dict):   # the corpus by content, wherever it lies
                data["corpus"] = {k: v for k, v in data["corpus"].items() if k in ("bytes", "sha256")}
            parts[name] = data
    return content_hash(parts) if parts else None


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 60 else "..." + text[-57:]


@contextmanager
def claim_output(out_dir: Path, benchmark: str) -> Iterator[None]:
    """Own run folder `out_dir` for this `benchmark` run until the block ends (created if missing).

    A second process on the same folder gets CLIError naming the owner's pid and writes nothing
    there (the lock is fcntl.flock on <out_dir>/.lock: the kernel drops it when the owner exits,
    kill -9 included, so a crashed run never leaves the folder locked).  A folder whose
    run_config.json names another benchmark is refused too, even with --resume --force: its
    records and ids would mix with this run's."""
    config = out_dir / "run_config.json"
    if config.exists():
        try:
            theirs = json.loads(config.read_text()).get("benchmark")
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs and theirs != benchmark:
            raise CLIError(f"--output {_shown(out_dir)} holds a {theirs} run; a {benchmark} run cannot use it, "
                           f"even with --resume --force: choose another --output")
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / OUTPUT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise CLIError(f"--output {_shown(out_dir)} is in use by process {holder} (another run writing there): "
                       f"wait for it to end, or choose another --output") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)      # releases the lock


def prepare_output(out_dir: Path, config: dict[str, Any], resume: bool, force: bool = False) -> None:
    """Create the run folder and write run_config.json; on --resume check nothing changed.

    A resume that changes anything (forced over compared keys, or only uncompared ones such as
    concurrency or git_commit) keeps the config it replaces in run_config.json's `history`:
    {"until": time, "records": lines of results.jsonl then, "forced", "changed": {key: {"from",
    "to"}}, "config"}, so the file describes the records written before as well."""
    from evaluation.runner import RESULTS_NAME

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "run_config.json"
    event, history = "start", []
    config = json.loads(json.dumps({**config, "git_commit": git_commit()}, default=str))   # as it is written
    if resume and path.exists():
        old = json.loads(path.read_text())
        history = old.pop("history", [])
        keys = sorted((set(old) | set(config)) - set(NOT_COMPARED))
        changed = [k for k in keys if old.get(k) != config.get(k)]
        diffs = "; ".join(f"{k}: {old.get(k)!r} -> {config.get(k)!r}" for k in changed)
        if changed and not force:
            raise CLIError(f"--resume {out_dir}: the run was started with other settings ({diffs}); "
                           f"use the same flags, another --output, or --resume --force to continue anyway "
                           f"(the change is recorded in {RUN_LOG})")
        event = f"resume, forced over changed settings: {diffs}" if changed else "resume"
        differ = {k: {"from": old.get(k), "to": config.get(k)} for k in sorted(set(old) | set(config))
                  if old.get(k) != config.get(k)}
        if differ:
            results = out_dir / RESULTS_NAME
            records = sum(1 for line in results.open("rb") if line.strip()) if results.exists() else 0
            history.append({"until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "records": records,
                            "forced": bool(changed), "changed": differ, "config": old})
    with (out_dir / RUN_LOG).open("a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {event}\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**config, **({"history": history} if history else {})}, indent=2) + "\n")
    os.replace(tmp, path)


def default_output(benchmark: str, model: str, mode: str) -> Path:
    return Path("runs") / f"{benchmark}-{model.replace('/', '_')}-{mode}"
