"""bench/gpu_scale.py (issue 49's many-GPU bench) on CPU actors: its three layouts on a local Ray
cluster (gloo), the trainer tests' tiny policy in the bench's heavy-tailed tool world, 2 steps
each, so the multi-worker path the GPU runs take cannot rot between them.

Checked per layout (colocated: 2 ZeRO-2 ranks with an engine in each; split 1:1 with broadcast
sync; split 1:1 asynchronous, max_staleness 1 in completion order): the weights changed, every
engine holds exactly the trainer's weights, both steps' metrics rows were written, the table
row was produced, NVLink multicast's switches reached every actor, and the driver's
BatchingEngine merged the episodes' seeded calls into shared engine calls (RayEngine takes
per-row seeds).  The targets' arithmetic is checked on hand-made rows.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # a local Ray cluster and DeepSpeed ranks

pytest.importorskip("ray", reason="scale-out tests need ray[default] (pip install 'ray[default]==2.60.*')")
pytest.importorskip("deepspeed", reason="scale-out tests need deepspeed (pip install deepspeed==0.19.8)")

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import gpu_scale

from training.metrics_log import read_metrics

LAYOUTS = ["colocated", "split 1:1", "split 1:1 async s=1 completion"]
ARGS = ["--device", "cpu", "--gpus", "2", "--steps", "2", "--staleness", "1", "--tasks-per-gpu", "1", "--group", "4",
        "--turns", "3", "--tokens", "8", "--median", "0.02", "--p99", "0.1", "--answer-prob", "0.5",
        "--cpus-per-worker", "0.5", "--threads", "1", "--micro-batch", "4", "--commit", "test-commit"]


@pytest.fixture(scope="module")
def scale_run(train_world, ray_local, tmp_path_factory):
    """One bench call, every layout at '2 GPUs' (2 CPU actors): (exit code, rows, table text)."""
    root = tmp_path_factory.mktemp("gpu-scale")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in gpu_scale.NVLS_OFF.items():
            mp.setenv(name, value)
        code = gpu_scale.main(ARGS + ["--policy", str(train_world[0]), "--workdir", str(root / "work"),
                                      "--json", str(root / "scale.json"), "--table", str(root / "scale.md")])
    return code, json.loads((root / "scale.json").read_text())["rows"], (root / "scale.md").read_text()


def test_every_layout_trains_and_the_engines_hold_the_trainers_weights(scale_run):
    code, rows, _ = scale_run
    assert [r["layout"] for r in rows] == LAYOUTS
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["gpus"] == 2 and row["rollouts_per_step"] == 8
        assert row["weights_changed"], row["layout"]              # the update moved the weights
        assert row["engines_equal_trainer"], row["layout"]        # ... and every engine got them
        assert row["nvls_off_in_actors"], row["layout"]           # forwarded through runtime_env
        assert row["gpu_ids"] == []                               # CPU actors: no GPU to sample
        metrics = read_metrics(Path(row["run_dir"]) / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2] and row["steps_logged"] == 2
        assert all(m["time/weight_sync"] >= 0 and "bench/sequence_tokens" in m for m in metrics)
        assert row["samples_trained"] > 0 and row["steps_per_hour"] > 0 and row["nemo_rl_tokens_per_s_per_gpu"] > 0
        # episodes' seeded turns share engine calls on the Ray path (1.0 would mean one row per call)
        assert row["rows_per_engine_call"] > 1, row["layout"]
    colocated, split, asynchronous = rows
    assert colocated["sync_kind"] == "inprocess" and colocated["engines"] == ["trainer-0-engine", "trainer-1-engine"]
    assert split["sync_kind"] == asynchronous["sync_kind"] == "broadcast" and split["engines"] == ["rollout-0"]
    staleness = [m.get("async/staleness_0", 0) + m.get("async/staleness_1", 0)
                 for m in read_metrics(Path(asynchronous["run_dir"]) / "metrics.jsonl")]
    assert staleness == [m["train/samples"] for m in read_metrics(Path(asynchronous["run_dir"]) / "metrics.jsonl")]
    assert code == 0


def test_each_run_writes_its_table_row(scale_run):
    _, rows, table = scale_run
    lines = table.strip().splitlines()
    header = gpu_scale.TABLE_HEADER.splitlines()
    assert lines[:2] == header and len(lines) == 2 + len(LAYOUTS)
    columns = header[0].count("|")
    for line, row in zip(lines[2:], rows):
        assert line == row["table_row"] and line.count("|") == columns   # no cell broke the row
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == ["2", row["layout"]] and cells[2] == row["model"] and cells[2].startswith("llama ")
        assert cells[10] == "cpu" and cells[12] == "test-commit"
        assert cells[11].startswith("`python bench/gpu_scale.py --device cpu --gpus 2")
    assert "x colocated (>= 1.5x)" in lines[-1]   # the async row is compared with the colocated one


def test_targets_are_marked_met_or_not_met_against_the_rows_of_the_file():
    def row(gpus, layout, sph, model="0.6b", **more):
        return {"gpus": gpus, "layout": layout, "model": model, "card": "H100", "steps_per_hour": sph, **more}

    base = row(1, "colocated", 100.0, reward={"mean": 0.5, "low": 0.4, "high": 0.6})
    sync8 = row(8, "colocated", 85.0, reward={"mean": 0.5, "low": 0.45, "high": 0.55})
    assert gpu_scale.targets(sync8, [base]) == ["weak scaling 85% of 1 GPU (>= 85%): met"]
    assert gpu_scale.targets(row(8, "colocated", 84.0), [base]) == ["weak scaling 84% of 1 GPU (>= 85%): not met"]
    other_card = {**base, "card": "H200"}
    assert "no 1-GPU colocated row" in gpu_scale.targets(sync8, [other_card])[0]
    fast = row(8, "split 4:4 async s=1 completion", 128.0, gpu_busy=0.81, reward={"mean": 0.6})
    assert gpu_scale.targets(fast, [base, sync8]) == [
        "1.51x colocated (>= 1.5x): met", "reward inside colocated's 95% interval: not met",
        "GPUs busy 81% (>= 80%): met"]
    big = row(8, "split 4:4", 10.0, model="8b", nemo_rl_tokens_per_s_per_gpu=1561.0, weight_sync_s=2.0)
    assert gpu_scale.targets(big, []) == ["1,561 NeMo-RL tokens/s/GPU (>= 1,562): not met", "sync 2.00 s (<= 2): met"]
    assert gpu_scale.targets({**big, "error": "boom"}, []) == ["not measured"]


def test_ray_engine_keeps_the_seeds_it_is_given_across_its_engines(ray_local):
    """BatchingEngine merges seeded calls only into engines that take per-row seeds."""
    from orchestrator.engines.interface import SamplingParams
    from orchestrator.engines.batcher import BatchingEngine
    from training.distributed.group import RayEngine

    @ray_local.remote(num_cpus=0)
    class Echo:
        def generate(self, prompts, params, seeds):
            return [(p[0], s) for p, s in zip(prompts, seeds)]

    engine = RayEngine([Echo.remote(), Echo.remote()], ["rollout-0", "rollout-1"], tokenizer=None)
    prompts = [[i] for i in range(5)]
    assert engine.generate(prompts, SamplingParams(seed=7), seeds=[40, 41, None, 43, 44]) == [
        (0, 40), (1, 41), (2, None), (3, 43), (4, 44)]
    assert engine.generate(prompts, SamplingParams(seed=7)) == [(i, 7 + i) for i in range(5)]
    with pytest.raises(ValueError, match="2 seeds for 5 prompts"):
        engine.generate(prompts, SamplingParams(seed=7), seeds=[1, 2])
    batcher = BatchingEngine(engine, max_batch=8)
    try:
        assert batcher._takes_seeds
    finally:
        batcher.close()
