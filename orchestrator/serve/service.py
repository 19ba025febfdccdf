"""What a server shares across requests and what one request is: the limits (`ServeLimits`), the
evaluation set-up (`Served`), readiness and admission to the worker threads (`Service`: the models
loaded at start-up, `concurrency` slots, `queue` waiting, 503 past that) and one request's episode
(`Job`: its budget and cancellation, orchestrator/cancellation.py)."""
import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable

from orchestrator.serve.schema import ECHO_CHARS, Budget, ChatRequest, RequestError, clip

log = logging.getLogger("orchestrator.serve")


@dataclass(frozen=True)
class ServeLimits:
    concurrency: int = 1             # episodes running at once
    queue: int = 16                  # requests waiting for a slot; past that 503
    request_timeout_s: float = 300.0
    max_question_chars: int = 100_000
    max_messages: int = 256
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 10.0     # retrieval/server.py's guards, reused (BodyLimit, server_config)
    header_timeout_s: float = 10.0
    max_header_bytes: int = 16384
    keep_alive_s: float = 30.0


@dataclass
class Served:
    """What every request of a server shares: the evaluation set-up of one model and section."""

    name: str                         # the model id clients ask for
    setup: Any                        # evaluation.qa.QASetup
    section: str
    profile: str
    search: bool                      # a retriever is configured (the search tool is offered)
    line: str = ""                    # what was chosen, as the evaluation scripts print it
    load: Callable[[], None] | None = None   # loads the in-process models (at start-up, before ready)


class Job:
    """One request's episode: runs in a worker thread under `stop` (orchestrator/cancellation.py);
    `before_turn` (the loop's hook) publishes finished turns and enforces the budget.  `cancel`
    sets `stop`: the episode ends before its next turn, its model call under way ends at its
    next token (in process) or within cancellation.SLICE_S (over HTTP)."""

    def __init__(self, request_id: str, question: str, preference, budget: Budget | None,
                 loop: asyncio.AbstractEventLoop):
        self.id, self.question, self.preference, self.budget = request_id, question, preference, budget
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled: str | None = None
        self.stop = threading.Event()
        self.started = time.monotonic()
        self._loop, self._sent, self._lock = loop, 0, threading.Lock()

    def cancel(self, why: str) -> None:
        self.cancelled = self.cancelled or why
        self.stop.set()

    def before_turn(self, rollout) -> str | None:
        for record in self.new_turns(rollout):      # to the stream, in order
            self._loop.call_soon_threadsafe(self.events.put_nowait, ("turn", record))
        if self.cancelled:
            return f"cancelled: {self.cancelled}"
        budget = self.budget
        if budget is not None and budget.turns is not None and len(rollout.turns) >= budget.turns:
            return f"budget: {len(rollout.turns)} turns taken, the request's budget is {budget.turns}"
        if budget is not None and budget.dollars is not None and rollout.cost >= budget.dollars:
            return f"budget: ${rollout.cost:.6f} spent, the request's budget is ${budget.dollars:g}"
        return None

    def new_turns(self, rollout) -> list[dict]:
        """Records of the turns finished since the last call (evaluation's turn record)."""
        from evaluation.qa import turn_record

        with self._lock:
            new, self._sent = rollout.turns[self._sent:], len(rollout.turns)
        return [turn_record(turn) for turn in new]


class Busy(RuntimeError):
    pass


class Service:
    """Admission (a semaphore of `concurrency` slots, `queue` waiting), worker threads, counts."""

    def __init__(self, served: Served, limits: ServeLimits):
        self.served, self.limits = served, limits
        self.pool = ThreadPoolExecutor(max_workers=limits.concurrency, thread_name_prefix="episode")
        self.slots: asyncio.Semaphore | None = None
        self.admitted = self.running = 0
        self.counts: dict[str, int] = {}
        self.loaded = threading.Event()        # the load ended, well or not
        self.load_error: str | None = None
        self.load_seconds: float | None = None

    @property
    def ready(self) -> bool:
        return self.loaded.is_set() and self.load_error is None

    def load(self) -> None:
        """Load the served models (`Served.load`; the app's start-up runs this in a thread): until it
        ends, GET /health/ready and chat requests answer 503."""
        started = time.monotonic()
        try:
            if self.served.load is not None:
                self.served.load()
        except Exception as exc:
            self.load_error = f"loading the models failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.load_error)
        else:
            self.load_seconds = round(time.monotonic() - started, 3)
            log.info("models loaded in %.1f s; ready", self.load_seconds)
        finally:
            self.loaded.set()

    def not_ready(self) -> str | None:
        """Why requests cannot be served yet (None: ready)."""
        if self.ready:
            return None
        if self.load_error:
            return self.load_error
        return "loading: the models are still loading (GET /health/ready answers 200 once loaded); retry shortly"

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def health(self) -> dict:
        return {"status": "ok", "ready": self.ready, "load_seconds": self.load_seconds, "load_error": self.load_error,
                "model": self.served.name, "profile": self.served.profile,
                "section": self.served.section, "search": self.served.search, "running": self.running,
                "queued": self.admitted - self.running,
                "limits": {"concurrency": self.limits.concurrency, "queue": self.limits.queue,
                           "request_timeout_s": self.limits.request_timeout_s}, "finished": dict(self.counts)}

    def task(self, body: ChatRequest):
        """(question, stated preference) of a request, or RequestError naming the field."""
        from data_synthesis.preferences import PreferenceError
        from evaluation.preference import state_preference

        if body.model != self.served.name:
            raise RequestError(404, "model", f"{clip(repr(body.model))} is not served here; this server serves "
                                             f"{self.served.name!r} (GET /v1/models)", "model_not_found")
        if len(body.messages) > self.limits.max_messages:
            raise RequestError(400, "messages", f"{len(body.messages)} messages; at most {self.limits.max_messages}")
        index = next((i for i in range(len(body.messages) - 1, -1, -1) if body.messages[i].role == "user"), None)
        if index is None:
            raise RequestError(400, "messages", "no message with role 'user': the last user message is the task")
        content = body.messages[index].content
        if isinstance(content, list):   # content parts: the text ones
            content = "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
        question = (content or "").strip()
        if not question:
            raise RequestError(400, f"messages.{index}.content", "the last user message is empty")
        if len(question) > self.limits.max_question_chars:
            raise RequestError(400, f"messages.{index}.content", f"{len(question)} characters; at most "
                                                                  f"{self.limits.max_question_chars}")
        preference = None
        if body.preference is not None:
            spec = json.dumps(body.preference) if isinstance(body.preference, dict) else body.preference
            if len(spec) > ECHO_CHARS:
                raise RequestError(400, "preference", f"{len(spec)} characters; a preset or a weight vector is at "
                                                      f"most {ECHO_CHARS} (e.g. cost, or accuracy=1,cost=0.5)")
            try:
                preference = state_preference(spec, self.served.setup.catalog, "qa", search=self.served.search)
            except PreferenceError as exc:    # it names the offending part (at most the spec's 200 characters)
                raise RequestError(400, "preference", str(exc)) from None
        return question, preference

    def admit(self) -> None:
        if self.admitted >= self.limits.concurrency + self.limits.queue:
            self.count("busy")
            raise Busy(f"server busy: {self.running} requests running and {self.admitted - self.running} waiting "
                       f"(--concurrency {self.limits.concurrency}, --queue {self.limits.queue}); retry later")
        self.admitted += 1

    async def start(self, job: Job, deadline: float) -> asyncio.Future:
        """Wait for a slot (until `deadline`), then run the episode in a worker thread under the
        job's cancel event.  The slot is held until the thread ends, also after a timeout or a
        disconnect (the episode then stops within about a second: `Job`), so at most
        `concurrency` episodes ever run."""
        from evaluation.qa import play
        from orchestrator.cancellation import cancellable
        from orchestrator.benchmarks import BenchmarkTask

        loop = asyncio.get_running_loop()
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.limits.concurrency)
        try:
            await asyncio.wait_for(self.slots.acquire(), max(0.0, deadline - loop.time()))
        except BaseException:            # the deadline, or the client gone while queued
            self.admitted -= 1
            raise
        self.running += 1
        setup = self.served.setup
        setup = replace(setup, preference=job.preference, loop=replace(setup.loop, before_turn=job.before_turn))
        task = BenchmarkTask(id=job.id, question=job.question, answer=None)

        def done(_future):
            self.running -= 1
            self.admitted -= 1
            self.slots.release()

        def run():
            with cancellable(job.stop):
                return play(setup, task)

        future = loop.run_in_executor(self.pool, run)
        future.add_done_callback(done)
        return future
