"""The sandbox's guarantees, one test each, for every isolation level that works here.

Levels that are not installed skip. As root, the unshare/rlimits levels need an interpreter
that user nobody can start (the venv's may live under /root): the system python3 is used then.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.sandbox import LEVELS, SandboxUnavailable, run_python
from orchestrator.sandbox.isolation import _nobody_can_run, probe

REPO = Path(__file__).resolve().parents[3]
SYSTEM_PYTHON = "/usr/bin/python3"


def _level_params(levels=LEVELS):
    return [pytest.param(level, id=level) for level in levels]


def _runs_as_root(result) -> bool:
    return result.runs_as == "root"


@pytest.mark.parametrize("level", _level_params())
def test_stdout_and_files_are_delivered(run, level):
    result = run("import helper\nprint(helper.VALUE * 7)", files={"helper.py": "VALUE = 6\n"})
    assert (result.stdout, result.exit_code, result.timed_out) == ("42\n", 0, False)
    assert result.duration_s > 0


@pytest.mark.parametrize("level", _level_params())
def test_exception_gives_nonzero_exit_and_traceback(run, level):
    result = run("def f():\n    raise ValueError('boom-7')\nf()\n")
    assert result.exit_code == 1 and not result.timed_out
    assert "ValueError: boom-7" in result.stderr and 'main.py", line 2' in result.stderr


_SPAWN_AND_SPIN = """
import os, signal, subprocess, sys, time
MARKER = {marker!r}
subprocess.Popen(["bash", "-c", "exec -a " + MARKER + "-sleep sleep 1000"])
if os.fork() == 0:      # a child that ignores SIGTERM, then becomes a marked python
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", MARKER + "-noterm"])
if {escape} and os.fork() == 0:   # double fork + setsid: leaves the process group
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", MARKER + "-setsid"])
    os._exit(0)
time.sleep(0.3)
print("spawned", flush=True)
{tail}
"""


@pytest.mark.parametrize("level", _level_params())
def test_infinite_loop_times_out_and_kills_every_process(run, level, alive_with):
    marker = f"sbx-{uuid.uuid4().hex}"
    # Without a pid namespace a setsid() escapee survives (documented), so rlimits skips it.
    code = _SPAWN_AND_SPIN.format(marker=marker, escape=level != "rlimits", tail="while True: pass")
    started = time.monotonic()
    result = run(code, timeout=2.0)
    elapsed = time.monotonic() - started
    assert "spawned" in result.stdout, result.stderr
    assert result.timed_out and result.exit_code == 128 + 9
    assert result.killed == "killed: wall-clock timeout 2 s" and result.stderr.endswith(f"[sandbox] {result.killed}\n")
    assert 2.0 <= result.duration_s < 3.0 and elapsed < 4.0
    assert alive_with(marker) == []


@pytest.mark.parametrize("level", _level_params())
def test_background_processes_die_when_main_exits(run, level, alive_with):
    marker = f"sbx-{uuid.uuid4().hex}"
    code = _SPAWN_AND_SPIN.format(marker=marker, escape=level != "rlimits", tail="print('done')")
    result = run(code, timeout=20.0)
    # They hold the stdout pipe open: returning at all shows they were killed, not waited for.
    assert result.stdout.endswith("done\n") and not result.timed_out and result.duration_s < 5
    assert alive_with(marker) == []


@pytest.mark.parametrize("level", _level_params())
def test_fork_bomb_is_stopped_by_the_process_limit(run, level):
    code = ("import os, time\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError as exc:\n"
            "        os.write(1, f'refused {exc.errno}\\n'.encode())  # one write: lines stay whole\n"
            "        time.sleep(60)\n")
    limit = 24
    probe_result = run("print('ok')")
    if _runs_as_root(probe_result):
        pytest.skip("the code would run as host root, which the kernel exempts from RLIMIT_NPROC")
    result = run(code, timeout=3.0, max_processes=limit)
    lines = result.stdout.splitlines()
    assert lines and all(line == "refused 11" for line in lines)  # EAGAIN from fork
    assert len(lines) <= limit and result.timed_out


@pytest.mark.parametrize("level", _level_params())
def test_cpu_limit_kills_a_busy_loop_before_the_timeout(run, level):
    result = run("while True: pass", timeout=20.0, cpu_seconds=1)
    assert not result.timed_out and result.exit_code == 128 + 24  # SIGXCPU
    assert result.killed == "killed: CPU limit 1 s per process (SIGXCPU)"   # not timed out: before the 20 s


@pytest.mark.parametrize("level", _level_params())
def test_memory_hog_gets_memory_error(run, level):
    result = run("block = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert result.exit_code != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout


@pytest.mark.parametrize("level", _level_params())
def test_huge_file_write_stopped_by_file_size_limit(run, level):
    code = ("import os\n"
            "with open('big.bin', 'wb') as f:\n"
            "    for _ in range(64):\n"
            "        f.write(b'x' * 1024 * 1024)\n"
            "        f.flush()\n")
    result = run(code, max_file_mb=2)
    assert result.exit_code != 0 and "File too large" in result.stderr


@pytest.fixture
def host_listener():
    """A TCP server on 127.0.0.1 in the host network namespace; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


_CONNECT = ("import socket\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('blocked', type(exc).__name__)\n")


@pytest.mark.parametrize("level", _level_params(("bwrap", "unshare")))
def test_network_is_blocked(run, level, host_listener):
    result = run(_CONNECT.format(port=host_listener))
    assert result.stdout.startswith("blocked"), result.stdout + result.stderr


@pytest.mark.parametrize("level", _level_params(("rlimits",)))
def test_rlimits_level_does_not_block_network(run, level, host_listener):
    # Pins the documented weakness, and shows the probe above can connect when not isolated.
    result = run(_CONNECT.format(port=host_listener))
    assert result.stdout == "connected\n"
    assert any("network" in w for w in result.warnings)


@pytest.mark.parametrize("level", _level_params())
def test_secrets_are_not_in_the_environment(run, level, monkeypatch):
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    result = run("import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(result.stdout)
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env and secret not in result.stdout
    assert env["LANG"] == "C.UTF-8"


@pytest.mark.parametrize("level", _level_params(("bwrap", "unshare")))
def test_host_process_environments_are_out_of_reach(run, level, monkeypatch):
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    code = ("import os\n"
            "hits = 0\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            f"        hits += {secret!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
            "    except OSError:\n"
            "        pass\n"
            "print('hits', hits, 'pids', len([p for p in os.listdir('/proc') if p.isdigit()]))\n")
    result = run(code)
    assert result.stdout.startswith("hits 0 "), result.stdout + result.stderr


@pytest.fixture
def scratch_root():
    """An empty folder that user nobody can enter (pytest's tmp_path is root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="sbx-root-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize("level", _level_params())
def test_scratch_dir_is_private_and_removed(run, level, scratch_root):
    code = ("import os, stat\n"
            "open('out.txt', 'w').write('x')\n"
            "print(oct(stat.S_IMODE(os.stat('.').st_mode)), sorted(os.listdir('.')))\n")
    result = run(code, scratch_root=str(scratch_root))
    assert result.stdout == "0o700 ['main.py', 'out.txt']\n", result.stderr
    assert list(scratch_root.iterdir()) == []


@pytest.mark.parametrize("level", _level_params(("bwrap",)))
def test_bwrap_cannot_write_outside_scratch(run, level, tmp_path):
    open_dir = tmp_path / "world-writable"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    targets = [str(open_dir / "x"), "/etc/sbx-x", "/usr/sbx-x", str(REPO / "sbx-x"), "/tmp/sbx-private"]
    code = ("import json\nout = {}\n"
            f"for path in {targets!r}:\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        out[path] = 'written'\n"
            "    except OSError as exc:\n"
            "        out[path] = type(exc).__name__\n"
            "print(json.dumps(out))\n")
    result = run(code)
    out = json.loads(result.stdout)
    assert all(out[path] != "written" for path in targets[:4]), out
    assert out["/tmp/sbx-private"] == "written"  # the sandbox's own tmpfs, not the host's /tmp
    assert not any(Path(p).exists() for p in targets)


@pytest.mark.parametrize("level", _level_params(("bwrap",)))
def test_bwrap_tmp_and_shm_are_capped_in_total(run, level):
    # Each file stays under the 2 MiB file-size limit; the second fills the 2 MiB tmpfs.
    code = ("import errno\n"
            "for folder in ('/tmp', '/dev/shm'):\n"
            "    try:\n"
            "        for i in range(2):\n"
            "            open(f'{folder}/f{i}', 'wb').write(b'x' * 1536 * 1024)\n"
            "        print(folder, 'both written')\n"
            "    except OSError as exc:\n"
            "        print(folder, errno.errorcode[exc.errno])\n")
    result = run(code, max_file_mb=2)
    assert result.stdout == "/tmp ENOSPC\n/dev/shm ENOSPC\n", result.stdout + result.stderr


@pytest.mark.parametrize("level", _level_params(("unshare", "rlimits")))
def test_host_user_levels_cannot_write_root_owned_dirs(run, level):
    if os.geteuid() != 0:
        pytest.skip("needs root to own a directory the sandbox user does not")
    target = REPO / f"sbx-{uuid.uuid4().hex}"
    result = run(f"open({str(target)!r}, 'w').write('x')")
    if _runs_as_root(result):
        target.unlink(missing_ok=True)
        pytest.skip("code runs as host root at this level here (see result.warnings)")
    assert "PermissionError" in result.stderr and not target.exists()


def test_output_is_capped_head_and_tail_kept():
    code = "import sys\nprint('FIRST')\nsys.stdout.write('y' * 20_000_000)\nprint('\\nLAST')\n"
    result = run_python(code, timeout=30, max_output_bytes=10_000)
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("FIRST\n") and result.stdout.endswith("LAST\n")
    assert len(result.stdout) < 10_100 and "bytes truncated" in result.stdout


def test_bad_arguments_are_rejected_with_the_argument_named():
    with pytest.raises(ValueError, match="timeout"):
        run_python("print(1)", timeout=-1)
    with pytest.raises(ValueError, match="files"):
        run_python("print(1)", files={"../escape.py": ""})
    with pytest.raises(ValueError, match="isolation"):
        run_python("print(1)", isolation="docker")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.sandbox", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_prints_one_json_object(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('from file')\nraise SystemExit(4)\n")
    done = _cli(str(script), "--timeout", "10")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["stdout"], result["exit_code"], result["timed_out"]) == ("from file\n", 4, False)
    assert {"stderr", "duration_s", "isolation", "warnings"} <= result.keys() and result["killed"] is None


def test_cli_rejects_missing_file_and_negative_timeout(tmp_path):
    missing = _cli(str(tmp_path / "absent.py"))
    assert missing.returncode == 2 and "absent.py" in missing.stderr and "does not exist" in missing.stderr
    script = tmp_path / "ok.py"
    script.write_text("print(1)\n")
    negative = _cli(str(script), "--timeout", "-5")
    assert negative.returncode == 2 and "--timeout" in negative.stderr and "positive" in negative.stderr


def test_unavailable_level_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("orchestrator.sandbox.isolation.probe", lambda level, python: "bwrap not installed")
    with pytest.raises(SandboxUnavailable, match="bwrap.*not installed"):
        run_python("print(1)", isolation="bwrap")


@pytest.mark.parametrize("level", _level_params(("bwrap",)))
def test_bwrap_code_holds_no_capabilities(run, level):
    result = run("print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))])")
    assert result.stdout.count("0000000000000000") == 2, result.stdout


def test_non_root_caller_gets_namespaces(host_listener):
    """The path a normal user takes (user namespaces), run here as nobody with the system python."""
    if os.geteuid() != 0:
        pytest.skip("this test switches to user nobody to play a non-root caller; it needs root")
    if not (os.path.exists(SYSTEM_PYTHON) and _nobody_can_run(SYSTEM_PYTHON)):
        pytest.skip(f"{SYSTEM_PYTHON} missing or not runnable by nobody")
    if not all(os.stat(p).st_mode & 0o005 == 0o005 for p in [REPO, *REPO.parents]):
        pytest.skip(f"{REPO} is not readable by nobody")
    import psutil
    site = str(Path(psutil.__file__).parents[1])   # the watchdog's psutil (an abi3 build) for the system python
    script = ("import json, sys\n"
              f"sys.path.insert(0, {str(REPO)!r})\nsys.path.append({site!r})\n"
              "from orchestrator.sandbox import available_levels, run_python\n"
              "out = {}\n"
              "for level in available_levels(sys.executable):\n"
              "    if level == 'rlimits':\n"
              "        continue\n"
              "    r = run_python('import os, socket\\n'\n"
              "                   'try:\\n'\n"
              f"                   '    socket.create_connection((\"127.0.0.1\", {host_listener}), timeout=1)\\n'\n"
              "                   '    print(\"connected\")\\n'\n"
              "                   'except OSError as e:\\n'\n"
              "                   '    print(type(e).__name__)\\n'\n"
              "                   'print(len([p for p in os.listdir(\"/proc\") if p.isdigit()]))\\n',\n"
              "                   isolation=level, timeout=10)\n"
              "    out[level] = [r.runs_as, r.stdout.split(), r.exit_code]\n"
              "print(json.dumps(out))\n")
    done = subprocess.run([SYSTEM_PYTHON, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd="/", user="nobody", env={"PATH": "/usr/bin:/bin"}, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    if not out:
        pytest.skip("user namespaces unavailable to non-root users here")
    assert "bwrap" in out or shutil.which("bwrap") is None, out
    for level, (runs_as, lines, exit_code) in out.items():
        # Inside a fresh pid namespace only a handful of processes exist.
        assert runs_as == "nobody" and exit_code == 0 and int(lines[-1]) < 5, (level, lines)
        assert lines[0] in ("ConnectionRefusedError", "OSError"), (level, lines)


# ---------------------------------------------------------------------------- hostile code (issue 15)
def _bwrap_run():
    """run(code, **kw) at the bwrap level, skipping when bubblewrap cannot run here."""
    why = probe("bwrap", sys.executable)
    if why is not None:
        pytest.skip(f"isolation bwrap unavailable here: {why}")

    def _run(code: str, **kw):
        kw.setdefault("timeout", 10)
        return run_python(code, isolation="bwrap", **kw)
    return _run


def test_bwrap_runs_the_environment_interpreter_with_its_packages():
    # The venv's own prefix and site-packages, not the system python: experts write numpy code.
    result = _bwrap_run()("import sys, numpy\nprint(sys.prefix)\nprint(int(numpy.arange(5).sum()))")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [sys.prefix, "10"]


def test_bwrap_denies_memfd_so_memory_cannot_hide_outside_the_limits():
    code = ("import errno, os\n"
            "try:\n"
            "    fd = os.memfd_create('hold')\n"
            "    for _ in range(64):\n"
            "        os.write(fd, b'x' * 1024 * 1024)\n"
            "    print('held 64 MiB')\n"
            "except OSError as exc:\n"
            "    print(errno.errorcode[exc.errno])\n")
    result = _bwrap_run()(code)
    assert result.stdout == "EPERM\n", result.stdout + result.stderr


def test_open_files_are_capped_so_socket_buffers_stay_bounded():
    # Each unread socketpair can hold ~200 KiB of kernel memory; the descriptor limit caps how many.
    code = ("import errno, socket\n"
            "pairs = []\n"
            "try:\n"
            "    while len(pairs) < 3000:\n"
            "        pairs.append(socket.socketpair())\n"
            "    print(len(pairs), 'none')\n"
            "except OSError as exc:\n"
            "    print(len(pairs), errno.errorcode[exc.errno])\n")
    result = _bwrap_run()(code, max_open_files=64)
    count, why = result.stdout.split()
    assert why == "EMFILE" and int(count) < 32, result.stdout + result.stderr


_NAMESPACE_ESCAPE = """
import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
    print('unshare', errno.errorcode[ctypes.get_errno()])
else:
    print('unshare ok')
tool = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c',
                       'mount -t tmpfs none /tmp && echo mounted'], capture_output=True, text=True)
print('tool', tool.returncode != 0, 'mounted' in tool.stdout)
"""


def test_bwrap_denies_nested_namespaces_so_no_uncapped_tmpfs_can_be_mounted():
    result = _bwrap_run()(_NAMESPACE_ESCAPE)
    assert result.stdout.splitlines() == ["unshare EPERM", "tool True False"], result.stdout + result.stderr


def _key_syscalls() -> tuple[int, int, int]:
    import platform
    numbers = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}.get(platform.machine())
    if numbers is None:
        pytest.skip(f"keyring syscall numbers not listed for {platform.machine()}")
    return numbers


_KEYRING_PROBE = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, REQUEST_KEY, KEYCTL = {numbers}
KEYCTL_SEARCH, KEYCTL_READ = 10, 11
out = []
for ring in (-3, -4):   # the session keyring the caller gave us, our uid's user keyring
    key = libc.syscall(KEYCTL, KEYCTL_SEARCH, ring, b'user', {desc!r}, 0)
    if key < 0:
        out.append('search ' + errno.errorcode[ctypes.get_errno()])
        continue
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(KEYCTL, KEYCTL_READ, key, buf, 256)
    out.append('read ' + buf.raw[:max(n, 0)].decode(errors='replace'))
data = b'left-by-run'
added = libc.syscall(ADD_KEY, b'user', {desc!r} + b'-run', data, len(data), -4)
out.append('add ' + ('ok' if added >= 0 else errno.errorcode[ctypes.get_errno()]))
print(' | '.join(out))
"""


def test_bwrap_code_reaches_no_kernel_keyring():
    add_key, _, keyctl = _key_syscalls()
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    desc = f"sbx-secret-{uuid.uuid4().hex}".encode()
    secret = b"caller-secret"
    key = libc.syscall(add_key, b"user", desc, secret, len(secret), -3)   # our session keyring
    if key < 0:
        pytest.skip(f"this process cannot use its session keyring (errno {ctypes.get_errno()})")
    try:
        run = _bwrap_run()
        code = _KEYRING_PROBE.format(numbers=_key_syscalls(), desc=desc)
        first, second = run(code), run(code)
    finally:
        libc.syscall(keyctl, 3, key)    # KEYCTL_REVOKE
    for result in (first, second):
        assert result.stdout.strip() == "search EPERM | search EPERM | add EPERM", result.stdout + result.stderr
        assert "caller-secret" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("level", _level_params())
def test_deep_read_only_tree_is_cleaned_up_with_a_result(run, level, scratch_root):
    code = ("import os\n"
            "os.chdir('.')\n"
            "for _ in range(3000):\n"
            "    os.mkdir('d')\n"
            "    os.chdir('d')\n"
            "open('ro.txt', 'w').write('x')\n"
            "os.chmod('ro.txt', 0o444)\n"
            "os.chdir('..')\n"
            "os.chmod('d', 0o500)\n"
            "print('deep')\n")
    result = run(code, timeout=30, scratch_root=str(scratch_root))
    assert result.stdout == "deep\n", result.stderr
    assert not any("not be removed" in w for w in result.warnings), result.warnings
    assert list(scratch_root.iterdir()) == []


def test_cleanup_failure_is_a_warning_not_an_exception(monkeypatch):
    from orchestrator.sandbox.cleanup import remove_tree

    def fails(path):
        remove_tree(path)   # (really removed, so the test leaves nothing behind)
        return f"scratch dir {path} stuck"
    monkeypatch.setattr("orchestrator.sandbox.runner.remove_tree", fails)
    result = run_python("print('ran')", timeout=10)
    assert result.stdout == "ran\n" and any(w.endswith("stuck") for w in result.warnings)


def test_missing_seccomp_is_reported_in_warnings(monkeypatch):
    from orchestrator.sandbox import isolation
    from orchestrator.sandbox.seccomp_filter import SeccompUnavailable

    _bwrap_run()

    def unavailable():
        raise SeccompUnavailable("no seccomp filter: pyseccomp missing")
    monkeypatch.setattr(isolation, "bpf_fd", unavailable)
    result = run_python("print(1)", isolation="bwrap", timeout=10)
    assert result.stdout == "1\n" and any("memfd" in w and "pyseccomp" in w for w in result.warnings)


def test_concurrent_runs_beside_a_fork_bomb_all_succeed():
    """64 runs at once, one of them a fork bomb: each run's process budget is its own."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.sandbox import cgroup

    run = _bwrap_run()
    if os.geteuid() != 0 and cgroup.detect()[0] is None:
        pytest.skip("a non-root caller without a delegated cgroup shares one process budget (docs/sandbox.md)")
    bomb = ("import os, time\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        time.sleep(30)\n")
    codes = [bomb] + [f"import os\nprint({i} * 2, os.getuid())" for i in range(1, 64)]
    def timed(code):
        start = time.monotonic()
        result = run(code, timeout=20 if code != bomb else 4)
        return result, start, time.monotonic()

    with ThreadPoolExecutor(max_workers=64) as pool:
        timed_results = list(pool.map(timed, codes))
    results = [r for r, _, _ in timed_results]
    assert results[0].timed_out
    spans: dict[str, list[tuple[float, float]]] = {}
    for i, (result, start, end) in enumerate(timed_results[1:], start=1):
        assert (result.exit_code, result.timed_out) == (0, False), (i, result.stderr)
        doubled, uid = result.stdout.split()
        assert int(doubled) == 2 * i
        spans.setdefault(uid, []).append((start, end))
    if os.geteuid() == 0:   # one uid per concurrent run: a uid seen twice only for runs that did not overlap
        for uid, runs in spans.items():
            runs.sort()
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(runs, runs[1:])), (uid, runs)
