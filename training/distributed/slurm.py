"""The Slurm commands the launcher scripts and the babysitter need, as typed Python calls.

    slurm = Slurm()
    job_id = slurm.submit("slurm/train.sbatch", ["--time=04:00:00"], env={"CONFIG": "..."})
    info = slurm.job(job_id)          # JobInfo(state="RUNNING", nodes=("gpu01", "gpu02"), ...)
    slurm.cancel(job_id)

A job's state comes from `squeue` while Slurm still lists it, then `scontrol show job`
(which also gives the exit code, for `MinJobAge` seconds after the end), then `sacct`
(when accounting is enabled); a job none of them knows is UNKNOWN.  Every command runs
with a timeout, and a failure raises `SlurmError` with the command and its stderr.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

# States in which a job still holds (or waits for) its allocation.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})


class SlurmError(RuntimeError):
    """A Slurm command failed or is missing; the message holds the command and its output."""


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job.  `state`: PENDING, RUNNING, COMPLETED, CANCELLED,
    TIMEOUT, PREEMPTED, FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE or UNKNOWN
    (Slurm no longer knows the job); `exit_code`: "code:signal" when known."""

    job_id: str
    state: str
    exit_code: str | None = None
    nodes: tuple[str, ...] = ()
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code in (None, "0:0")


class Slurm:
    """Runs Slurm's command-line tools (`timeout_s` seconds each)."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    @staticmethod
    def unavailable_reason() -> str | None:
        """None when sbatch/squeue exist and the controller answers; else why not."""
        missing = [c for c in ("sbatch", "squeue", "scontrol", "scancel") if shutil.which(c) is None]
        if missing:
            return f"Slurm commands not found on PATH: {', '.join(missing)}"
        try:
            subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=15, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            return f"the Slurm controller does not answer squeue: {detail.strip()}"
        return None

    def _run(self, cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, env=env, cwd=cwd)
        except FileNotFoundError:
            raise SlurmError(f"{cmd[0]}: command not found (is Slurm installed and on PATH?)") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(cmd)}: no answer after {self.timeout_s:g} s (controller busy or down?)") from None
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
        return proc

    def submit(self, script: str, sbatch_args: list[str] = (), env: dict[str, str] | None = None,
               cwd: str | None = None) -> str:
        """`sbatch --parsable [args] script`; returns the job id.  `env` adds to this process's
        environment (sbatch exports it to the job)."""
        full_env = {**os.environ, **(env or {})}
        out = self._run(["sbatch", "--parsable", *sbatch_args, script], env=full_env, cwd=cwd).stdout.strip()
        job_id = out.split(";")[0].strip()        # "123" or "123;cluster"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch {script}: unexpected output {out!r} (expected a job id)")
        return job_id

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        self._run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        """Expand a Slurm node list ("gpu[01-03],cpu7") to host names."""
        if not nodelist or nodelist in ("(null)", "None assigned"):
            return ()
        if not any(c in nodelist for c in "[,"):
            return (nodelist,)
        return tuple(self._run(["scontrol", "show", "hostnames", nodelist]).stdout.split())

    def job(self, job_id: str) -> JobInfo:
        """The job's state: squeue, then scontrol (exit code), then sacct; UNKNOWN if none knows it."""
        proc = self._run(["squeue", "-h", "-j", job_id, "-o", "%T|%N|%r"], check=False)
        line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
        if line:
            state, nodes, reason = (line.split("|") + ["", ""])[:3]
            if state in ACTIVE_STATES:
                return JobInfo(job_id, state, None, self.hostnames(nodes), reason)
        return self._ended_job(job_id)

    def _ended_job(self, job_id: str) -> JobInfo:
        proc = self._run(["scontrol", "show", "job", "-o", job_id], check=False)
        if proc.returncode == 0 and "JobState=" in proc.stdout:
            fields = dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)
            return JobInfo(job_id, fields["JobState"], fields.get("ExitCode"),
                           self.hostnames(fields.get("NodeList", "")), fields.get("Reason", ""))
        proc = self._run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList"], check=False)
        lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
        if lines and "|" in lines[0]:
            state, exit_code, nodes = (lines[0].split("|") + ["", ""])[:3]
            return JobInfo(job_id, state.split()[0] if state else "UNKNOWN", exit_code or None,
                           self.hostnames(nodes))
        return JobInfo(job_id, "UNKNOWN")
