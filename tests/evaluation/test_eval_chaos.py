"""Evaluation under chaos, the short version (issue 28 items 2 and 4; the long one is
bench/chaos_eval.py): run_frames.py's code against the mock backend (a subprocess) and the
retrieval server (a subprocess), each behind bench/faults.py's proxy.

- 30 tasks at concurrency 8, clean and with 10% of requests faulted (every kind, bursts of 2) and
  the retrieval server killed and restarted once mid-run, with stray provider variables pointing
  at a dead port: the same records, none lost or duplicated, no call past its retry budget, every
  token the backend served either in the records (as in the clean run) or counted as wasted.
- resources at concurrency 64: the same 64 tasks four times on the same servers; after the fourth
  run this process holds what it held after the second (fds, threads, connections, memory).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chaos_eval import MAX_RETRIES, compare, one_run, write_world  # noqa: E402

from faults import FaultPlan  # noqa: E402
from orchestrator.resources import ResourceSampler  # noqa: E402

TASKS = 64
STRAY = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chaos")
    write_world(folder, TASKS)
    return folder


@pytest.mark.slow
def test_evaluation_under_faults_and_a_retrieval_restart_gives_the_clean_runs_records(world, monkeypatch):
    from _retrieval_world import dead_url

    for var in STRAY:                     # a stray provider / proxy variable reroutes nothing
        monkeypatch.setenv(var, dead_url() + ("/v1" if "BASE" in var else ""))
    clean = one_run(world, "clean", concurrency=8, replicas=1, plan=FaultPlan(rate=0.0), limit=30)
    plan = FaultPlan(seed=0, rate=0.1, burst=2, retry_after=0.5, stall_s=4.0, trickle_s=0.5)
    chaos = one_run(world, "chaos", concurrency=8, replicas=1, plan=plan, restarts_at=[15], limit=30)
    assert clean["code"] == chaos["code"] == 0
    result = compare(clean, chaos)
    assert result["problems"] == []
    assert result["tasks"] == result["correct"] == 30 and result["errors"] == 0
    assert len(chaos["lines"]) == len(set(chaos["lines"])) == 30
    # the faults happened as planned: each proxy's log is its plan's sequence
    for proxy in [*chaos["llm"], chaos["retrieval"]]:
        assert proxy.faults() == proxy.plan.sequence(len(proxy.log))
    llm_faults = {e.fault for p in chaos["llm"] for e in p.log} - {None}
    assert len(llm_faults) >= 6, llm_faults
    assert 0.05 < sum(e.fault is not None for p in chaos["llm"] for e in p.log) / sum(len(p.log) for p in chaos["llm"]) < 0.2
    # the restart happened mid-run and searches met the dead server (502 from the proxy) and got through
    assert [e for _, e in chaos["retrieval_events"]][:3] == ["ready", "killed (SIGKILL)", "ready"]
    assert result["faults"].get("upstream_down", 0) > 0
    assert 1 < result["max_attempts_llm"] <= MAX_RETRIES + 1
    # cut replies: the tokens the backend spent on them are counted as wasted, in tokens and dollars
    cut = [e for p in chaos["llm"] for e in p.log if e.forwarded and not e.delivered]
    assert sum(e.usage["completion_tokens"] for e in cut) == result["wasted_tokens"]["completion_tokens"]
    assert (result["wasted_usd"] > 0) == bool(cut)
    # run_config.json records where each model was called: the registry's pool, not the variables
    endpoints = chaos["config"]["endpoints"]
    assert set(endpoints) == {"mock-orch", "mock-expert"}
    assert endpoints["mock-orch"]["replicas"] == [chaos["llm"][0].url + "/v1"]


@pytest.mark.slow
def test_resources_stay_flat_over_repeated_runs_at_concurrency_64(world):
    """Four runs of the same 64 tasks on the same servers: from the end of the second to the end of
    the fourth (128 tasks) nothing grows.  Pools (HTTP keep-alive, the proxies' upstream
    connections) settle at sizes that vary by a few tens with timing; a leak of one descriptor,
    thread or connection per 4 tasks would add 32."""
    sampler = ResourceSampler(interval_s=0.5).start()
    run = one_run(world, "resources", concurrency=64, replicas=1, plan=FaultPlan(rate=0.0), sampler=sampler,
                  repeat=4)
    sampler.stop()
    assert run["code"] == 0 and len(run["records"]) == TASKS and all(r["correct"] for r in run["records"])
    ends = {s.label: s for s in sampler.samples if s.label.endswith(" end")}
    second, fourth = ends["resources-2 end"], ends["resources-4 end"]
    assert fourth.fds - second.fds < 32, (second, fourth)
    assert fourth.connections - second.connections < 32, (second, fourth)
    assert fourth.threads - second.threads <= 2, (second, fourth)
    assert fourth.rss_mb - second.rss_mb < 32, (second, fourth)       # under 0.25 MB per task
    import resource
    assert max(s.fds for s in sampler.samples) < resource.getrlimit(resource.RLIMIT_NOFILE)[0] / 4
