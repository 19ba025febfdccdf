"""The babysitter: keeps a Slurm deployment running (counterpart of upstream's resume_h100.py).

    python -m training.babysitter --config slurm/cluster.example.yaml          # loop every poll_s seconds
    python -m training.babysitter --config slurm/cluster.example.yaml --once   # one pass (cron, tests)
    python -m training.babysitter --config slurm/cluster.example.yaml --status # jobs, states, replicas
    python -m training.babysitter --config slurm/cluster.example.yaml --cancel # scancel every tracked job

Each pass:
  1. health-checks every replica in the endpoints file (GET <server>/health) and removes,
     atomically, those that failed `unhealthy_after` passes in a row;
  2. for each *service* job (expert servers, retriever): submits it if it is not running;
     when it ended (time limit, pre-emption, crash) removes its replicas and resubmits it; a
     job RUNNING for `start_timeout_s` without one healthy replica is cancelled and resubmitted;
  3. for each *batch* job (training, evaluation): resubmits it until it COMPLETES with exit
     0 (or writes its `done_file`); training resumes from its newest checkpoint by itself
     (`run.resume: auto`).  A job that ends `max_stalled` times without a new checkpoint,
     or more than `max_resubmits` resubmits, is given up on, with a log line saying why.

State (job ids, resubmit counts) lives in `<state_dir>/jobs.json` (atomic writes), the log
in `<state_dir>/babysitter.log`; one babysitter per state_dir (a lock file enforces it).
Touch `<state_dir>/STOP` to pause submissions.  `${VAR}`s in the config are read from the
environment (accounts, partitions, paths, images), so nothing site-specific is baked in.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.gateway.endpoints import read_endpoints, unregister_endpoint
from orchestrator.redaction import install_log_redaction
from training.distributed.slurm import JobInfo, Slurm, SlurmError

log = logging.getLogger("toolorchestra.resume")
_UNSET_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


class BabysitterConfigError(ValueError):
    """The babysitter config is invalid; the message names the file and field."""


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["service", "batch"]
    script: str                                   # an sbatch script, e.g. slurm/serve_experts.sbatch
    sbatch_args: list[str] = []                   # added after the top-level sbatch_args
    env: dict[str, str] = {}                      # exported to the job (sbatch exports the environment)
    keys: list[str] = []                          # service: endpoints-file keys its servers register
    start_timeout_s: float = Field(1800.0, gt=0)  # service: RUNNING this long with no healthy replica -> restart
    checkpoints: str | None = None                # batch: checkpoint folder, to see progress between resubmits
    done_file: str | None = None                  # batch: a file the job writes when all its work is done
    max_resubmits: int | None = Field(None, ge=0)  # default: the top-level value


class BabysitterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state_dir: str
    endpoints_file: str | None = None             # default $TOOLORCHESTRA_ENDPOINTS
    poll_s: float = Field(60.0, gt=0)
    health_timeout_s: float = Field(5.0, gt=0)
    unhealthy_after: int = Field(3, ge=1)         # failed health checks in a row before a replica is dropped
    max_resubmits: int = Field(10, ge=0)          # per job, over the babysitter's life
    max_stalled: int = Field(3, ge=1)             # batch: ends in a row without a new checkpoint -> give up
    sbatch_args: list[str] = []                   # for every job, e.g. ["--account=${SLURM_ACCOUNT}"]
    env: dict[str, str] = {}                      # for every job
    jobs: list[JobSpec] = Field(min_length=1)

    @field_validator("jobs")
    @classmethod
    def _unique_names(cls, jobs: list[JobSpec]) -> list[JobSpec]:
        names = [j.name for j in jobs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"job names must be unique, repeated: {sorted(dup)}")
        return jobs


def _expand(value, where: str):
    """Expand ${VAR} from the environment in every string; an unset variable is an error."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        missing = [m for m in _UNSET_VAR.findall(value) if m not in os.environ]
        if missing:
            raise BabysitterConfigError(f"{where}: ${missing[0]} is not set in the environment "
                                        f"(export it before starting the babysitter)")
        return os.path.expandvars(value)
    return value


def load_babysitter_config(path: str | Path) -> BabysitterConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise BabysitterConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise BabysitterConfigError(f"{path}: invalid YAML: {exc}") from None
    try:
        cfg = BabysitterConfig.model_validate(_expand(data, str(path)) if isinstance(data, dict) else data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise BabysitterConfigError(f"{path}: {where}: {err['msg']}") from None
    if cfg.endpoints_file is None:
        cfg.endpoints_file = os.environ.get("TOOLORCHESTRA_ENDPOINTS")
    for job in cfg.jobs:
        if job.kind == "service" and job.keys and not cfg.endpoints_file:
            raise BabysitterConfigError(f"{path}: jobs[{job.name}].keys: needs endpoints_file (or $TOOLORCHESTRA_ENDPOINTS)")
    return cfg


def server_root(base_url: str) -> str:
    """http://host:port/v1 -> http://host:port (where /health lives)."""
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class Babysitter:
    """One `tick()` = one pass over the endpoints file and every job (see the module docstring)."""

    def __init__(self, cfg: BabysitterConfig, slurm: Slurm | None = None, *, cwd: str | None = None,
                 http: httpx.Client | None = None, clock=time.time):
        self.cfg, self.slurm, self.cwd, self.clock = cfg, slurm or Slurm(), cwd, clock
        self.http = http or httpx.Client(timeout=cfg.health_timeout_s)
        self.state_dir = Path(cfg.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.state_dir / "jobs.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.state.setdefault("jobs", {})
        self.state.setdefault("replica_failures", {})

    # ------------------------------------------------------------------ state
    def job_state(self, name: str) -> dict:
        return self.state["jobs"].setdefault(name, {"job_id": None, "submits": 0, "stalled": 0, "last_step": None,
                                                     "done": False, "gave_up": None, "unhealthy": 0,
                                                     "running_since": None, "history": []})

    def save(self) -> None:
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)

    # ------------------------------------------------------------------ one pass
    def tick(self) -> None:
        if self.cfg.endpoints_file:
            self.sweep_endpoints()
        for spec in self.cfg.jobs:
            try:
                self.tend(spec)
            except SlurmError as exc:   # the controller may be briefly unreachable: try next pass
                log.error("%s: %s (retrying next pass)", spec.name, exc)
        self.save()

    def healthy(self, base_url: str) -> bool:
        try:
            return self.http.get(server_root(base_url) + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def sweep_endpoints(self) -> None:
        """Health-check every replica; drop those failing `unhealthy_after` passes in a row."""
        path = Path(self.cfg.endpoints_file)
        failures = self.state["replica_failures"]
        for key, replicas in read_endpoints(path).items():
            for replica in replicas:
                url, tag = replica.base_url, f"{key} {replica.base_url}"
                if self.healthy(url):
                    failures.pop(tag, None)
                    continue
                failures[tag] = failures.get(tag, 0) + 1
                if failures[tag] >= self.cfg.unhealthy_after:
                    unregister_endpoint(path, key, url)
                    failures.pop(tag, None)
                    log.warning("endpoints: removed %s from %s (failed %d health checks in a row)", tag, path,
                                self.cfg.unhealthy_after)

    def tend(self, spec: JobSpec) -> None:
        st = self.job_state(spec.name)
        if st["done"] or st["gave_up"]:
            return
        if st["job_id"] is None:
            self.submit(spec, st, "first submission")
            return
        info = self.slurm.job(st["job_id"])
        if info.active:
            if info.state == "RUNNING":
                st["running_since"] = st["running_since"] or self.clock()
                if spec.kind == "service":
                    self.check_service(spec, st, info)
            return
        self.ended(spec, st, info)

    def ended(self, spec: JobSpec, st: dict, info: JobInfo) -> None:
        how = f"{info.state}" + (f" (exit {info.exit_code})" if info.exit_code else "")
        st["history"].append({"job_id": info.job_id, "state": info.state, "exit_code": info.exit_code,
                              "ended_seen": time.strftime("%Y-%m-%dT%H:%M:%S")})
        st["running_since"], st["unhealthy"] = None, 0
        if spec.kind == "batch":
            if info.succeeded or (spec.done_file and Path(spec.done_file).exists()):
                st["done"] = True
                log.info("%s: job %s %s: finished", spec.name, info.job_id, how)
                return
            step = self.latest_step(spec)
            if spec.checkpoints is not None:
                st["stalled"] = st["stalled"] + 1 if step == st["last_step"] else 0
                st["last_step"] = step
                if st["stalled"] >= self.cfg.max_stalled:
                    self.give_up(spec, st, f"ended {st['stalled']} times in a row without a new checkpoint "
                                           f"(still step {step}); see its Slurm logs")
                    return
            where = f"; resuming from checkpoint step {step}" if step is not None else ""
            self.submit(spec, st, f"job {info.job_id} {how}{where}")
        else:
            self.drop_replicas(spec, info.nodes)
            self.submit(spec, st, f"job {info.job_id} {how}")

    def check_service(self, spec: JobSpec, st: dict, info: JobInfo) -> None:
        """A RUNNING service with no healthy replica after start_timeout_s is restarted."""
        if not spec.keys or not self.cfg.endpoints_file:
            return
        urls = self.replicas_on(spec, info.nodes)
        if any(self.healthy(u) for _, u in urls):
            st["unhealthy"] = 0
            return
        if self.clock() - st["running_since"] < spec.start_timeout_s:
            return
        st["unhealthy"] += 1
        if st["unhealthy"] >= self.cfg.unhealthy_after:
            log.warning("%s: job %s RUNNING for %.0f s without a healthy replica of %s: cancelling it",
                        spec.name, info.job_id, self.clock() - st["running_since"], spec.keys)
            self.slurm.cancel(info.job_id)

    # ------------------------------------------------------------------ helpers
    def replicas_on(self, spec: JobSpec, nodes: tuple[str, ...]) -> list[tuple[str, str]]:
        """(key, base_url) of the job's keys whose host is one of `nodes` (short names compared)."""
        short = {n.split(".")[0] for n in nodes}
        pools = read_endpoints(Path(self.cfg.endpoints_file))
        return [(k, r.base_url) for k in spec.keys for r in pools.get(k, [])
                if (urlparse(r.base_url).hostname or "").split(".")[0] in short]

    def drop_replicas(self, spec: JobSpec, nodes: tuple[str, ...]) -> None:
        if not spec.keys or not self.cfg.endpoints_file:
            return
        for key, url in self.replicas_on(spec, nodes):
            unregister_endpoint(self.cfg.endpoints_file, key, url)
            log.warning("endpoints: removed %s %s (its job ended)", key, url)

    def latest_step(self, spec: JobSpec) -> int | None:
        if spec.checkpoints is None:
            return None
        from training.checkpoint import list_checkpoints   # imports torch: only when needed

        found = list_checkpoints(spec.checkpoints)
        return int(found[-1].name.split("-")[1]) if found else None

    def give_up(self, spec: JobSpec, st: dict, why: str) -> None:
        st["gave_up"] = why
        log.error("%s: giving up: %s", spec.name, why)

    def submit(self, spec: JobSpec, st: dict, why: str) -> None:
        if (self.state_dir / "STOP").exists():
            log.info("%s: not submitting (%s exists): %s", spec.name, self.state_dir / "STOP", why)
            return
        limit = self.cfg.max_resubmits if spec.max_resubmits is None else spec.max_resubmits
        if st["submits"] > limit:
            self.give_up(spec, st, f"{why}; already resubmitted {limit} times (max_resubmits)")
            return
        env = {**self.cfg.env, **spec.env, "TOOLORCHESTRA_JOB_NAME": spec.name}
        if self.cfg.endpoints_file:
            env.setdefault("TOOLORCHESTRA_ENDPOINTS", str(Path(self.cfg.endpoints_file).resolve()))
        args = [f"--job-name={spec.name}", *self.cfg.sbatch_args, *spec.sbatch_args]
        try:
            job_id = self.slurm.submit(spec.script, args, env=env, cwd=self.cwd)
        except SlurmError as exc:
            st["job_id"] = None     # submit again next pass
            log.error("%s: sbatch failed (%s); retrying next pass", spec.name, exc)
            return
        if spec.kind == "batch" and st["last_step"] is None:
            st["last_step"] = self.latest_step(spec)
        st["job_id"], st["submits"] = job_id, st["submits"] + 1
        count = "" if st["submits"] == 1 else f" (resubmit {st['submits'] - 1}/{limit})"
        log.info("%s: %s -> submitted job %s%s", spec.name, why, job_id, count)

    # ------------------------------------------------------------------ CLI actions
    def status_rows(self) -> list[dict]:
        rows = []
        for spec in self.cfg.jobs:
            st = self.job_state(spec.name)
            info = self.slurm.job(st["job_id"]) if st["job_id"] else None
            note = st["gave_up"] or ("done" if st["done"] else "")
            if spec.kind == "batch" and spec.checkpoints is not None:
                step = self.latest_step(spec)
                note = (f"checkpoint step {step} " if step is not None else "no checkpoint yet ") + note
            rows.append({"name": spec.name, "kind": spec.kind, "job": st["job_id"] or "-",
                         "state": info.state if info else "-", "nodes": ",".join(info.nodes) if info else "",
                         "submits": st["submits"], "note": note.strip()})
        return rows

    def cancel_all(self) -> None:
        for spec in self.cfg.jobs:
            st = self.job_state(spec.name)
            if st["job_id"] and self.slurm.job(st["job_id"]).active:
                self.slurm.cancel(st["job_id"])
                log.info("%s: cancelled job %s", spec.name, st["job_id"])
        (self.state_dir / "STOP").touch()
        log.info("wrote %s: no further submissions until it is removed", self.state_dir / "STOP")

    def finished(self) -> bool:
        """Every batch job is done or given up on (services run until cancelled)."""
        return all(self.job_state(s.name)["done"] or self.job_state(s.name)["gave_up"]
                   for s in self.cfg.jobs if s.kind == "batch")


def _lock(state_dir: Path):
    handle = open(state_dir / "babysitter.lock", "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BabysitterConfigError(f"another babysitter already manages {state_dir} "
                                    f"(lock {state_dir / 'babysitter.lock'}); stop it first") from None
    return handle


def _setup_logging(state_dir: Path) -> None:
    install_log_redaction()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(state_dir / "babysitter.log")):
        handler.setFormatter(fmt)
        log.addHandler(handler)
    log.setLevel(logging.INFO)


def _print_status(rows: list[dict]) -> None:
    from rich.console import Console  # lazy: display only, slow to import
    from rich.table import Table

    table = Table(title="babysitter")
    for col in ("name", "kind", "job", "state", "nodes", "submits", "note"):
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(row[c]) for c in ("name", "kind", "job", "state", "nodes", "submits", "note")))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.babysitter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="babysitter YAML (slurm/cluster.example.yaml)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--once", action="store_true", help="one pass, then exit (1 if a job was given up on)")
    action.add_argument("--status", action="store_true", help="print the tracked jobs and exit")
    action.add_argument("--cancel", action="store_true", help="scancel every tracked job and write STOP")
    parser.add_argument("--exit-when-done", action="store_true",
                        help="loop until every batch job has finished or been given up on")
    args = parser.parse_args(argv)
    try:
        cfg = load_babysitter_config(args.config)
        state_dir = Path(cfg.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = None if args.status else _lock(state_dir)  # noqa: F841  (held until exit; --status only reads)
    except BabysitterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reason = Slurm.unavailable_reason()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    _setup_logging(state_dir)
    sitter = Babysitter(cfg, cwd=os.getcwd())
    if args.status:
        _print_status(sitter.status_rows())
        return 0
    if args.cancel:
        sitter.cancel_all()
        sitter.save()
        return 0
    log.info("babysitter: %d job(s), state in %s, endpoints %s", len(cfg.jobs), state_dir, cfg.endpoints_file)
    try:
        while True:
            sitter.tick()
            if args.once or (args.exit_when_done and sitter.finished()):
                break
            time.sleep(cfg.poll_s)
    except KeyboardInterrupt:
        log.info("babysitter stopped (the jobs keep running; rerun to resume watching them)")
    gave_up = [s.name for s in cfg.jobs if sitter.job_state(s.name)["gave_up"]]
    return 1 if gave_up else 0


if __name__ == "__main__":
    raise SystemExit(main())
