"""orchestrator/resources.py: the open-files limit raised at start, and the resource sampler."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def in_child(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (limits are per process: the test's own stay as they are)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_the_soft_open_files_limit_is_raised_to_the_hard_one_silently():
    proc = in_child("""
        import resource
        from orchestrator.resources import raise_nofile_limit
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        print(raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard) or hard)
    """)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    line, ok = proc.stdout.rsplit(" ", 1)
    assert line.startswith("open-files limit ") and ok.strip() == "True"


def test_a_limit_that_cannot_be_raised_far_enough_is_one_line_on_stderr():
    proc = in_child("""
        import resource
        from orchestrator.resources import raise_nofile_limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
        raise_nofile_limit()
    """)
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == ["note: the open-files limit is 300 (the hard limit); a run at concurrency 64 "
                                        "may fail with 'Too many open files': ask for a higher hard limit (ulimit -Hn)"]


def test_the_evaluation_entry_point_raises_its_limit_before_anything_else():
    proc = in_child("""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        from evaluation.qa_cli import main
        try:
            main("frames", ["--stop-after-errors", "-1"])    # refused at once, after the limit is raised
        except SystemExit:
            pass
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)
    """)
    assert proc.stdout.strip().splitlines()[-1] == "True", proc.stderr


def test_the_sampler_counts_descriptors_threads_and_connections_it_is_shown():
    import socket
    import threading

    from orchestrator.resources import ResourceSampler, sample

    before = sample()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    with ResourceSampler(interval_s=0.05) as sampler:
        now = sampler.mark("open")
    stop.set()
    thread.join()
    accepted, _ = server.accept()
    for s in (client, server, accepted):
        s.close()
    assert now.fds >= before.fds + 2 and now.threads >= before.threads + 1
    assert now.connections >= before.connections + 2          # the listener and the client end
    assert [s.label for s in sampler.samples][0] == "start" and sampler.samples[-1].label == "end"
