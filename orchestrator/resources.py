"""What a long run holds: file descriptors, threads, memory, connections (issue 28 item 4).

    note = raise_nofile_limit()     # at start (evaluation and training entry points)
    with ResourceSampler(interval_s=1.0) as sampler:
        ...                         # the run
    sampler.samples                 # [Sample(t, fds, threads, rss_mb, connections), ...]

`raise_nofile_limit` lifts this process's soft RLIMIT_NOFILE to its hard limit: at concurrency 64
a run holds an HTTP connection per call in flight, per model and per retrieval replica, plus the
sandbox's pipes, and the usual soft limit of 1024 is what upstream's forks hit as `Too many open
files`.  When it cannot (no resource module, a hard limit below what we want, or setrlimit
refused) it prints one line saying so and what the limit stays at.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass, field

WANT_NOFILE = 65536   # the soft limit asked for when the hard limit is unlimited
LOW_NOFILE = 4096     # below this, a run at concurrency 64 may run out: said at start


def raise_nofile_limit(*, quiet: bool = False) -> str:
    """Raise the soft open-files limit to the hard limit; return one line on the outcome, printed
    (to stderr, unless quiet) when the limit could not be raised or stays below LOW_NOFILE."""
    try:
        import resource
    except ImportError:   # not on POSIX
        return _say("note: no resource module here; the open-files limit stays as the system set it", quiet)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else WANT_NOFILE
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            return _say(f"note: could not raise the open-files limit from {soft} to {target} ({exc}); "
                        f"run `ulimit -n {target}` first if the run fails with 'Too many open files'", quiet)
        soft = target
    if soft != resource.RLIM_INFINITY and soft < LOW_NOFILE:
        return _say(f"note: the open-files limit is {soft} (the hard limit); a run at concurrency 64 may "
                    f"fail with 'Too many open files': ask for a higher hard limit (ulimit -Hn)", quiet)
    return f"open-files limit {soft}"


def _say(note: str, quiet: bool) -> str:
    if not quiet:
        print(note, file=sys.stderr)
    return note


@dataclass
class Sample:
    t: float             # seconds since the sampler started
    fds: int             # open file descriptors
    threads: int
    rss_mb: float
    connections: int     # open inet sockets (TCP/UDP, any state but closed)
    label: str = ""


def sample(label: str = "", t: float = 0.0) -> Sample:
    """This process's resources now (psutil)."""
    import psutil  # lazy: only when sampling

    proc = psutil.Process()
    return Sample(t=round(t, 2), fds=proc.num_fds(), threads=proc.num_threads(),
                  rss_mb=round(proc.memory_info().rss / 2**20, 1),
                  connections=len(proc.net_connections(kind="inet")), label=label)


@dataclass
class ResourceSampler:
    """Samples `sample()` every `interval_s` on a thread of its own; `mark(label)` adds one now."""

    interval_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.mark()

    def mark(self, label: str = "") -> Sample:
        s = sample(label, time.monotonic() - self._started)
        self.samples.append(s)
        return s

    def start(self) -> "ResourceSampler":
        self.mark("start")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.mark("end")

    def rows(self) -> list[dict]:
        return [asdict(s) for s in self.samples]

    def __enter__(self) -> "ResourceSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


