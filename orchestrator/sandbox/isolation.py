"""Isolation levels for the code sandbox and the command line that applies each.

Three levels, strongest first (see docs/sandbox.md for what each one stops):

- ``bwrap``:   bubblewrap. New pid, net, ipc and uts namespaces; a new root file system
  that holds only /usr, /etc, the Python install (all read-only), a private /proc and
  /dev, a size-capped tmpfs /tmp and the scratch directory (the only host path writable).
- ``unshare``: util-linux ``unshare`` with a user namespace plus pid, net, ipc, uts and
  mount namespaces. The host file system stays visible with the host user's permissions.
- ``rlimits``: resource limits, a process group and a scrubbed environment only.
  No network isolation.

Every level runs under ``prlimit`` (util-linux) for CPU seconds, address space,
process count, open files, file size and core dumps. When started as root, the code runs
as a host uid of its own per run (identity.py), because the kernel exempts root from the
process-count limit, root owns most host files, and runs sharing one uid share one
process budget. bwrap adds a seccomp filter (seccomp_filter.py); every level adds a
cgroup v2 per run where one is delegated (cgroup.py); what neither holds for the whole run
(total memory, process count, the scratch dir's size) a watchdog thread holds (watchdog.py).
What a run lacks is listed in its ``warnings``.
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.sandbox import cgroup as cgroups
from orchestrator.sandbox.identity import NoFreeUid, UidLease, lease_uid
from orchestrator.sandbox.seccomp_filter import SeccompUnavailable, bpf_fd

LEVELS = ("bwrap", "unshare", "rlimits")
SCRATCH_INSIDE_BWRAP = "/scratch"  # where bwrap mounts the scratch directory
_NOBODY_FALLBACK = 65534


class SandboxUnavailable(RuntimeError):
    """The requested isolation level cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits (applied with setrlimit through prlimit)."""

    cpu_seconds: int      # CPU time; SIGXCPU at the soft limit, SIGKILL one second later
    memory_mb: int        # address space (RLIMIT_AS), MiB
    max_processes: int    # processes + threads of the sandbox's host user (RLIMIT_NPROC)
    max_file_mb: int      # largest file the code may write (RLIMIT_FSIZE), MiB; bwrap's /tmp, /dev/shm size
    max_open_files: int = 128   # file descriptors per process (RLIMIT_NOFILE): bounds socket/pipe buffers

    def prlimit_argv(self) -> list[str]:
        mib = 1024 * 1024
        return [
            _need("prlimit"),
            f"--cpu={self.cpu_seconds}:{self.cpu_seconds + 1}",
            f"--as={self.memory_mb * mib}",
            f"--nproc={self.max_processes}",
            f"--fsize={self.max_file_mb * mib}",
            f"--nofile={self.max_open_files}",
            "--core=0",
            "--",
        ]


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter and the directories it needs to start (its install roots)."""

    path: str
    roots: tuple[str, ...]


@dataclass
class Plan:
    """How one run is started: the argv, who runs it, where the code sees its scratch dir.

    A plan holds resources (a leased uid, a seccomp pipe, a cgroup): `release()` them."""

    argv: list[str]
    level: str
    runs_as: str                           # host identity of the code, e.g. "uid 1900000042"
    popen_user: tuple[int, int] | None     # (uid, gid) to switch to before exec, if any
    chown_to: tuple[int, int] | None       # owner the scratch dir must have
    workdir: str | None                    # scratch path as the code sees it (None: host path)
    warnings: list[str] = field(default_factory=list)
    pass_fds: tuple[int, ...] = ()         # descriptors the command reads (bwrap --seccomp FD)
    lease: UidLease | None = None
    cgroup: cgroups.RunCgroup | None = None

    def close_fds(self) -> None:
        """Once the command has started: the parent's copies of pass_fds are not needed."""
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pass_fds = ()

    def release(self) -> list[str]:
        """Free the plan's resources after the run is gone; returns what could not be freed."""
        self.close_fds()
        problems = []
        if self.cgroup is not None:
            why = self.cgroup.remove()
            if why:
                problems.append(why)
            self.cgroup = None
        if self.lease is not None:
            if self.level == "rlimits":   # no pid namespace: setsid() escapees still hold the uid
                _kill_uid(self.lease.uid)
            self.lease.release()
            self.lease = None
        return problems


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (kill(-1) as that uid reaches exactly its own processes)."""
    try:
        subprocess.run([_need("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                        "/bin/kill", "-KILL", "-1"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError, SandboxUnavailable):
        pass


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SandboxUnavailable(f"'{tool}' not found on PATH (Debian package util-linux)")
    return path


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return _NOBODY_FALLBACK, _NOBODY_FALLBACK


@functools.lru_cache(maxsize=8)
def interpreter(python: str) -> Interpreter:
    """Ask `python` for its install prefixes (cached). Raises SandboxUnavailable if it won't run."""
    resolved = shutil.which(python) or python
    probe = ("import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix,"
             " sys.base_exec_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]))")
    try:
        out = subprocess.run([resolved, "-I", "-c", probe], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"interpreter {python!r} does not run: {exc}") from exc
    prefixes = json.loads(out)
    # Bind both the path as named and its target, so symlinked installs resolve inside too.
    candidates = {os.path.abspath(p) for p in prefixes} | {os.path.realpath(p) for p in prefixes}
    roots: list[str] = []
    for root in sorted(candidates):
        # /usr is bound whole; nested roots are covered by their parent.
        if root == "/" or root.startswith("/usr/") or root == "/usr":
            continue
        if not any(root.startswith(r + "/") for r in roots):
            roots.append(root)
    return Interpreter(path=os.path.abspath(resolved), roots=tuple(roots))


@functools.lru_cache(maxsize=8)
def _nobody_can_run(python: str) -> bool:
    """Root only: can uid nobody start this interpreter (e.g. not if it lives under /root)?"""
    uid, gid = _nobody()
    try:
        return subprocess.run([python, "-I", "-c", "pass"], user=uid, group=gid, extra_groups=[],
                              capture_output=True, timeout=30, cwd="/", check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _system_binds() -> list[str]:
    """/usr and /etc read-only, plus the host's /bin, /lib... (symlinks into /usr on Debian)."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _interpreter_binds(roots: tuple[str, ...]) -> list[str]:
    """The interpreter's install folders read-only, their parents passable (0755).

    bwrap creates missing parents 0700 and owned by root, so a venv under /root or /work
    would be unreachable for the sandbox uid: the interpreter would then start without
    its prefix and fall back to the system's stdlib (no site-packages, no numpy)."""
    args: list[str] = []
    made: set[str] = set()
    for root in roots:
        for parent in reversed(Path(root).parents):
            name = str(parent)
            if name not in ("/", "/tmp", "/dev/shm") and name not in made and not name.startswith("/usr"):
                args += ["--perms", "0755", "--dir", name]
                made.add(name)
        args += ["--ro-bind", root, root]
    return args


def _cgroup_for(limits: Limits, warnings: list[str]) -> cgroups.RunCgroup | None:
    parent, why = cgroups.detect()
    if parent is None:
        warnings.append(f"no cgroup for the run ({why}): the kernel caps memory per process (RLIMIT_AS), "
                        "not for the whole run")
        return None
    try:
        return cgroups.RunCgroup.create(parent, limits.memory_mb, limits.max_processes)
    except OSError as exc:
        warnings.append(f"no cgroup for the run (creating one under {parent} failed: {exc})")
        return None


def _run_identity(warnings: list[str]) -> tuple[UidLease | None, str]:
    """Root: a leased uid of its own for this run; else (None, the caller's name)."""
    if os.geteuid() != 0:
        warnings.append("processes count against the caller's uid: concurrent runs share max_processes")
        return None, pwd.getpwuid(os.getuid()).pw_name
    try:
        lease = lease_uid()
    except NoFreeUid as exc:
        raise SandboxUnavailable(str(exc)) from exc
    return lease, f"uid {lease.uid}"


def _bwrap_plan(interp: Interpreter, scratch: str, limits: Limits) -> Plan:
    warnings: list[str] = []
    args = [_need("bwrap"), "--die-with-parent", "--new-session"]
    setpriv, rlimits = _need("setpriv"), limits.prlimit_argv()   # before the uid lease: no leak on a missing tool
    lease, runs_as = _run_identity(warnings)
    if lease is not None:
        # Root keeps its real uid inside a user namespace (uid 0 is exempt from RLIMIT_NPROC),
        # so instead bwrap sets up the mounts as root and setpriv drops to the run's uid before exec;
        # nested namespaces (no --disable-userns without a user namespace) are denied by seccomp.
        args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        tail = [setpriv, f"--reuid={lease.uid}", f"--regid={lease.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        chown_to = (lease.uid, lease.uid)
    else:
        args += ["--unshare-all", "--unshare-user", "--disable-userns"]
        tail, chown_to = [], None
    pass_fds: tuple[int, ...] = ()
    try:
        fd = bpf_fd()
        args += ["--seccomp", str(fd)]
        pass_fds = (fd,)
    except SeccompUnavailable as exc:
        warnings.append(f"{exc}: memfd, keyrings, io_uring, ptrace, bpf and nested namespaces are not denied")
    args += _system_binds()
    # tmpfs lives in RAM outside RLIMIT_AS: cap /tmp and /dev/shm (else half the RAM each).
    tmpfs_size = str(limits.max_file_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", tmpfs_size, "--perms", "1777", "--tmpfs", "/tmp",
             "--size", tmpfs_size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    # after the tmpfs mounts (bwrap applies them in order): a venv under /tmp stays visible
    args += _interpreter_binds(interp.roots)
    args += ["--bind", scratch, SCRATCH_INSIDE_BWRAP, "--chdir", SCRATCH_INSIDE_BWRAP, "--"]
    cgroup = _cgroup_for(limits, warnings)
    prefix = cgroup.enter_argv() if cgroup else []
    return Plan(argv=prefix + rlimits + args + tail + [interp.path], level="bwrap",
                runs_as=runs_as, popen_user=None, chown_to=chown_to, workdir=SCRATCH_INSIDE_BWRAP,
                warnings=warnings, pass_fds=pass_fds, lease=lease, cgroup=cgroup)


def _host_user_plan(level: str, interp: Interpreter, limits: Limits) -> Plan:
    """unshare and rlimits levels: the code runs as a host user, a leased uid when we are root."""
    warnings: list[str] = [f"no seccomp filter at the {level} level (bwrap only): memfd, keyrings, "
                           "io_uring, ptrace, bpf and nested namespaces are not denied"]
    popen_user, lease = None, None
    runs_as = pwd.getpwuid(os.getuid()).pw_name
    prefix_argv = limits.prlimit_argv() + [_need("setpriv"), "--pdeathsig=KILL", "--"]
    unshare = _need("unshare") if level == "unshare" else None
    if os.geteuid() == 0:
        if _nobody_can_run(interp.path):   # a leased uid has the same (world) permissions as nobody
            lease, runs_as = _run_identity(warnings)
            popen_user = (lease.uid, lease.uid)
        else:
            warnings.append(f"runs as host root: user nobody cannot start {interp.path}, so files root "
                            "can write outside the scratch dir are writable and RLIMIT_NPROC does not "
                            "apply (root is exempt); install bubblewrap")
    else:
        warnings.append("processes count against the caller's uid: concurrent runs share max_processes")
    # setpriv --pdeathsig: the sandbox dies with the thread that started it.
    argv = prefix_argv
    if unshare:
        # A shell as pid 1 of the namespace: Python as pid 1 would ignore its own fatal signals.
        argv += [unshare, "--user", "--map-root-user", "--net", "--pid", "--fork",
                 "--kill-child", "--mount", "--mount-proc", "--ipc", "--uts", "--",
                 "/bin/sh", "-c", '"$@"; exit $?', "sh"]
    else:
        warnings.append("no network isolation and no pid namespace (rlimits level)")
    argv.append(interp.path)
    cgroup = _cgroup_for(limits, warnings)
    prefix = cgroup.enter_argv() if cgroup else []
    return Plan(argv=prefix + argv, level=level, runs_as=runs_as, popen_user=popen_user,
                chown_to=popen_user, workdir=None, warnings=warnings, lease=lease, cgroup=cgroup)


def plan_for(level: str, interp: Interpreter, scratch: str, limits: Limits) -> Plan:
    """The command for `level`; append the interpreter's arguments (e.g. ["-s", "main.py"])."""
    if level == "bwrap":
        return _bwrap_plan(interp, scratch, limits)
    if level in ("unshare", "rlimits"):
        return _host_user_plan(level, interp, limits)
    raise ValueError(f"isolation must be one of auto, {', '.join(LEVELS)}; got {level!r}")


def popen_user_kwargs(plan: Plan) -> dict:
    """subprocess.Popen keyword arguments that switch to the plan's host user, if any."""
    if plan.popen_user is None:
        return {}
    return {"user": plan.popen_user[0], "group": plan.popen_user[1], "extra_groups": []}


@functools.lru_cache(maxsize=32)
def probe(level: str, python: str) -> str | None:
    """None if `level` starts Python here, else why not (cached per process)."""
    try:
        interp = interpreter(python)
        limits = Limits(cpu_seconds=10, memory_mb=1024, max_processes=64, max_file_mb=1)
        with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as scratch:
            plan = plan_for(level, interp, scratch, limits)
            try:
                if plan.chown_to:
                    os.chown(scratch, *plan.chown_to)
                user = popen_user_kwargs(plan)
                done = subprocess.run(plan.argv + ["-c", "pass"], capture_output=True, text=True, timeout=30,
                                      cwd=scratch, env={"PATH": "/usr/bin:/bin"}, check=False,
                                      pass_fds=plan.pass_fds, **user)
            finally:
                plan.release()
    except SandboxUnavailable as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{level} probe failed: {exc}"
    if done.returncode != 0:
        return f"{level} probe exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return None


def available_levels(python: str) -> list[str]:
    """Isolation levels that work on this machine for `python`, strongest first."""
    return [level for level in LEVELS if probe(level, python) is None]


def choose_level(requested: str, python: str) -> str:
    """Resolve "auto" to the strongest working level; check an explicit one works."""
    if requested == "auto":
        for level in LEVELS:
            if probe(level, python) is None:
                return level
        raise SandboxUnavailable("no isolation level works here: " + probe("rlimits", python))
    if requested not in LEVELS:
        raise ValueError(f"isolation must be one of auto, {', '.join(LEVELS)}; got {requested!r}")
    why = probe(requested, python)
    if why is not None:
        raise SandboxUnavailable(f"isolation {requested!r} unavailable: {why}")
    return requested
