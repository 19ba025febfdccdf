"""Function tools at run time: open each tools.json entry into the functions the policy sees,
call one under its deadline, and record what it cost (orchestrator/records.py ExpertCall: the
same record, cost and latency the paper's tools have, so the reward reads them alike).

A tool that cannot be opened (a handler that does not import, an MCP server that does not start,
an unset credential) is offered as a stand-in whose every call is recorded as an error naming
the tool and the fix; it is tried again after RETRY_BROKEN_S.  Nothing here raises into the
episode: every failure of a call becomes `ExpertCall.error`, with secrets redacted.
"""
from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from typing import Any

from orchestrator.redaction import redact
from orchestrator.records import ExpertCall
from orchestrator.tools.registry import (KINDS, CallContext, Function, FunctionKind, ToolFailure, function_kind,
                                         load_builtin_kinds)
from orchestrator.tools.spec import FunctionToolSpec
from orchestrator.tools.workers import Deadline, run_async, run_sync


# Types of the modules that import this package, named without importing them (no import cycle):
Catalog = Any          # orchestrator.catalog.Catalog
EpisodeState = Any     # orchestrator.context.EpisodeState

log = logging.getLogger("toolorchestra.tools")
RETRY_BROKEN_S = 30.0
RECORD_CHARS = 2000          # the record keeps this much of an output (the context gets it all)


class Toolbox:
    """Opened functions per tools.json entry (by content), shared by every episode of a process."""

    def __init__(self):
        self._opened: dict[str, tuple[list[Function], float]] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def functions(self, spec: FunctionToolSpec, runtime=None) -> list[Function]:
        key = spec.model_dump_json()
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:           # concurrent episodes open an entry once (one import, one server listing)
            with self._lock:
                held = self._opened.get(key)
            if held is not None and (not held[0] or held[0][0].broken is None or time.monotonic() < held[1]):
                return held[0]
            return self._open(key, spec, runtime)

    def _open(self, key: str, spec: FunctionToolSpec, runtime) -> list[Function]:
        kind = function_kind(spec.kind)
        try:
            opened = kind.functions(spec, runtime)
        except ToolFailure as exc:
            opened = self._stand_ins(kind, spec, exc)
        except Exception as exc:   # noqa: BLE001 - a broken tool must not break the run
            opened = self._stand_ins(kind, spec, ToolFailure(f"{type(exc).__name__}: {exc}",
                                                             fix=f"check tools.json entry {spec.name!r}"))
        with self._lock:
            self._opened[key] = (opened, time.monotonic() + RETRY_BROKEN_S)
        return opened

    @staticmethod
    def _stand_ins(kind: FunctionKind, spec: FunctionToolSpec, exc: ToolFailure) -> list[Function]:
        log.warning("%s", redact(f"tool {spec.name!r} ({spec.kind}) is not available: {exc}; fix: {exc.fix}; "
                                 f"its calls are recorded as errors until it is"))
        return [Function(name, spec.description or f"{spec.kind} tool {spec.name} (unavailable)",
                         {"type": "object", "properties": {}, "additionalProperties": True}, spec, _unavailable,
                         broken=exc)
                for name in kind.stand_ins(spec)]

    def offered(self, catalog: Catalog, task: str = "qa", runtime=None, taken: set[str] = frozenset()) -> list[Function]:
        """The functions of every function tool of `catalog` that episodes of `task` offer.  A
        name already taken (by another tool) is left out, with a warning naming the fix."""
        out: list[Function] = []
        seen = set(taken)
        for spec in catalog.tools:
            if function_kind(spec.kind) is None or task not in spec.tasks:
                continue
            for fn in self.functions(spec, runtime):
                if fn.name in seen:
                    log.warning("tool %r of tools.json entry %r is left out: another tool has that name; set the "
                                "entry's `prefix` (mcp) or rename one", fn.name, spec.name)
                    continue
                seen.add(fn.name)
                out.append(fn)
        return out

    def invoke(self, fn: Function, arguments: dict[str, Any], catalog: Catalog,
               state: EpisodeState | None = None, runtime=None) -> tuple[ExpertCall, str]:
        """Call `fn`; return its record (output cut to RECORD_CHARS, error, cost, latency) and
        the whole output text (what the episode's context gets: the output, or the error)."""
        spec = fn.spec
        call = ExpertCall(tool=fn.name, alias=fn.name, model=spec.price_row)
        started = time.monotonic()
        text = ""
        try:
            if fn.broken is not None:
                raise fn.broken
            ctx = CallContext(state, runtime, spec.timeout_s)
            if fn.is_async:
                out = run_async(lambda: fn.call(arguments, ctx), spec.timeout_s)
            else:
                out = run_sync(lambda: fn.call(arguments, ctx), spec.timeout_s + fn.grace_s)
            text = output_text(out, spec)
        except Deadline:
            call.error = (f"no result within its deadline ({spec.timeout_s:g} s); fix: make it faster or raise "
                          f"`timeout_s` of tools.json entry {spec.name!r}")
        except ToolFailure as exc:
            call.error = f"{exc}{'; fix: ' + exc.fix if exc.fix else ''}"
        except Exception as exc:   # noqa: BLE001 - the tool raised: recorded, the episode goes on
            call.error = (f"it raised {type(exc).__name__}: {exc}; fix: the tool's code "
                          f"({getattr(spec, 'handler', None) or spec.name}) should return a result for these arguments")
        call.latency = time.monotonic() - started
        if call.error is not None:
            call.error = redact(f"tool {fn.name!r} ({spec.kind}): {call.error}")[:2000]
            text = f"error: {call.error}"
        text = redact(text)
        call.output = text[:RECORD_CHARS]
        counter = getattr(runtime, "counter", None)
        count = counter.count if counter is not None else (lambda s: (len(s) + 3) // 4)
        call.cost = catalog.tool_cost(spec.price_row, seconds=call.latency,
                                      input_tokens=count(json.dumps(arguments)), output_tokens=count(text))
        return call, text


def _unavailable(arguments: dict, ctx: CallContext) -> Any:   # never called: `broken` is raised first
    raise RuntimeError("unavailable")


def output_text(out: Any, spec: FunctionToolSpec) -> str:
    """The output as text: a string as it is, any other JSON value as JSON.  Not JSON, or longer
    than the tool's max_output_chars: a ToolFailure naming what came back."""
    if isinstance(out, str):
        text = out
    else:
        try:
            text = json.dumps(out, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ToolFailure(f"it returned a {type(out).__name__}, which is not JSON ({exc})",
                              fix="return a str, number, bool, None, list or dict") from None
    if len(text) > spec.max_output_chars:
        raise ToolFailure(f"it returned {len(text):,} characters, over its max_output_chars ({spec.max_output_chars:,})",
                          fix="return less (a summary, the first results), or raise the entry's max_output_chars")
    return text


TOOLBOX = Toolbox()


@atexit.register
def _close_all() -> None:
    for kind in list(KINDS.values()):
        if isinstance(kind, FunctionKind):
            kind.close()


load_builtin_kinds()
