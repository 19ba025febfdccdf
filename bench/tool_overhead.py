"""Per-call overhead of function tools (orchestrator/tools/): the calculator of docs/tools.md called
directly, as a `python` tool (the toolbox: a worker thread with the tool's deadline, JSON output,
pricing, record), and the units server's `convert_length` as an `mcp` tool over stdio (one shared
session); then tool calls per second with 32 QA episodes at once (a scripted policy that calls the
tool `--calls` times and answers; no model runs, so this is the tool path's own ceiling).

    python bench/tool_overhead.py [--repeats 2000] [--mcp-repeats 300] [--episodes 32] [--calls 8] [--write]

--write puts the tables into the "Function tools" section of docs/benchmarks.md (others kept).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _report import BENCHMARKS, load, machine, write_section  # noqa: E402

from examples.tools.calculator import calculate  # noqa: E402
from orchestrator.catalog import parse_catalog  # noqa: E402
from orchestrator.loop import LoopConfig, Task, run_episodes  # noqa: E402
from orchestrator.policy import PolicyOutput  # noqa: E402
from orchestrator.records import LLMResponse, Usage  # noqa: E402
from orchestrator.setup import build_runtime  # noqa: E402 (after the sys.path insert)
from orchestrator.toolcall import format_tool_call  # noqa: E402
from orchestrator.tools.registry import KINDS  # noqa: E402
from orchestrator.tools.workers import run_async  # noqa: E402

SECTION = "## Function tools"
CALC_ARGS = {"expression": "(3 + 4) * 2 / 7"}
MCP_ARGS = {"value": 2.0, "unit": "mi", "to": "km"}


def catalog():
    data = json.loads((ROOT / "tools.json").read_text())
    data["tools"] += [{"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"},
                      {"name": "units", "kind": "mcp", "command": [sys.executable, str(ROOT / "examples/tools/units_mcp.py")],
                       "include": ["convert_length"]}]
    data["prices"].update({"calculator": {"per_call": 0.0001}, "units": {"per_call": 0.0005}})
    return parse_catalog(data, "bench")


def per_call(fn, repeats: int) -> tuple[float, float]:
    """(median, p90) microseconds of `fn()`."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


class Policy:
    """Calls `tool` with `args` `calls` times, then answer-2 (one script per episode)."""

    price_model = "Qwen3-8B"

    def __init__(self, tool: str, args: dict, calls: int):
        self.script = [format_tool_call(tool, args)] * calls + [format_tool_call("answer", {"model": "answer-2"})]

    def act(self, messages, tools, *, choices=None, grammar=None, temperature=1.0, max_tokens=1024):
        done = messages[-1]["content"].count("[tool] ")     # the calls made so far, as the context lists them
        return PolicyOutput(text=self.script[min(done, len(self.script) - 1)], usage=Usage(100, 10), latency=0.0)


def answering_llm(model, messages, **kw):
    return LLMResponse(model=model, text="<answer>2</answer>", usage=Usage(1000, 200))


def episodes_per_second(runtime, tool: str, args: dict, episodes: int, calls: int) -> tuple[float, int, int]:
    """(tool calls per second, calls made, calls that failed) over `episodes` concurrent episodes."""
    tasks = [Task(f"t{i}", "q") for i in range(episodes)]
    start = time.perf_counter()
    rollouts = run_episodes(tasks, Policy(tool, args, calls), runtime, LoopConfig(max_turns=calls + 1),
                            concurrency=episodes)
    elapsed = time.perf_counter() - start
    made = [t.expert for r in rollouts for t in r.turns if t.expert is not None and t.expert.tool == tool]
    return len(made) / elapsed, len(made), sum(1 for c in made if c.error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2000, help="calls per in-process measurement")
    parser.add_argument("--mcp-repeats", type=int, default=300, help="calls of the MCP tool")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--calls", type=int, default=8, help="tool calls per episode")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    cat = catalog()
    runtime = build_runtime(None, {}, cat, llm=answering_llm)   # the one builder (tests/orchestrator/test_settings.py)
    functions = {f.name: f for f in runtime.functions(cat)}
    calc, units = functions["calculator"], functions["convert_length"]
    for fn in (calc, units):
        if fn.broken is not None:
            raise SystemExit(f"{fn.name}: {fn.broken}")
    mcp_kind = KINDS["mcp"]
    session = mcp_kind.session(units.spec)

    def sdk_call():
        async def call():
            return await (await session.get()).call_tool("convert_length", MCP_ARGS)
        return run_async(call, 30.0)

    load_before = load()
    rows = [("direct function call", *per_call(lambda: calculate(**CALC_ARGS), args.repeats)),
            ("`python` tool (toolbox.invoke)", *per_call(lambda: runtime.call_function(calc, CALC_ARGS, None, cat),
                                                         args.repeats)),
            ("MCP SDK `call_tool` on the same stdio session (no toolbox)", *per_call(sdk_call, args.mcp_repeats)),
            ("`mcp` tool over stdio (toolbox.invoke)", *per_call(lambda: runtime.call_function(units, MCP_ARGS, None, cat),
                                                                  args.mcp_repeats))]
    throughput = [(name, *episodes_per_second(runtime, tool, a, args.episodes, args.calls))
                  for name, tool, a in (("python", "calculator", CALC_ARGS), ("mcp (stdio)", "convert_length", MCP_ARGS))]
    load_after = load()
    command = (f"python bench/tool_overhead.py --repeats {args.repeats} --mcp-repeats {args.mcp_repeats} "
               f"--episodes {args.episodes} --calls {args.calls}")
    base = rows[0][1]
    lines = [SECTION, "",
             "Per-call cost of the function-tool path (orchestrator/tools/, docs/tools.md): the calculator called "
             "directly, as a `python` tool, and the example MCP server's `convert_length` as an `mcp` tool over "
             "stdio (one session shared by every call); microseconds, median and p90. Then tool calls per second "
             f"with {args.episodes} QA episodes at once, each calling the tool {args.calls} times (a scripted policy "
             "and answer expert: no model runs, so these are the tool path's own ceilings, episode loop included).",
             "", f"Machine: {machine()}; 1-minute load average {load_before:.1f} before, {load_after:.1f} after "
                 "(the box is shared with other agents' work: figures are noisy, read them as orders of magnitude).",
             "", f"Command: `{command}`", "",
             "| call | median µs | p90 µs | overhead vs direct (median) |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {med:,.1f} | {p90:,.1f} | {med - base:+,.1f} |" for name, med, p90 in rows]
    lines += ["", f"| {args.episodes} episodes at once | tool calls / s | calls | failed |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {rate:,.0f} | {made} | {failed} |" for name, rate, made, failed in throughput]
    lines += ["", "A `python` tool's overhead is the hop to a worker thread (the deadline: the episode waits at "
              "most `timeout_s`), JSON encoding, redaction and pricing; an `mcp` call adds the JSON-RPC round trip "
              "to the server process through the background event loop. Concurrent episodes share one MCP session.", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(text)
        print(f"written to {BENCHMARKS}")


if __name__ == "__main__":
    main()
