"""Ray + DeepSpeed on CPU: the scale-out code path with gloo instead of NCCL (training/distributed).

A local Ray cluster runs two DeepSpeed ZeRO-2 trainer ranks and one rollout engine (the
transformers engine) as actors.  Checked: the two-rank update gives the single-process
update's loss and gradient norm; after the bucketed broadcast the engine holds exactly the
trainer's weights and generates what transformers generates with them; two steps of the
distributed training loop run, log their weight-sync time and write a checkpoint that
holds the same weights plus DeepSpeed's optimizer partitions.
"""
from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # starts a Ray cluster and DeepSpeed ranks (~1-3 min)

pytest.importorskip("ray", reason="scale-out tests need ray[default] (pip install 'ray[default]==2.60.*')")
pytest.importorskip("deepspeed", reason="scale-out tests need deepspeed (pip install deepspeed==0.19.8)")

import torch  # noqa: E402

from _train_world import fake_runtime, overrides  # noqa: E402
from orchestrator.engines.interface import SamplingParams  # noqa: E402
from training.config import load_config  # noqa: E402
from training.distributed.config import DistributedConfig, DistributedConfigError  # noqa: E402
from training.samples import TurnSample  # noqa: E402


def _samples(vocab: int, n: int = 7, seed: int = 0) -> list[TurnSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))]
        response = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
        mask = [1] * len(response)
        mask[0] = 0 if i % 3 == 0 else 1          # some tool-output tokens inside the response
        out.append(TurnSample(prompt, response, mask, None, advantage=rng.uniform(-2, 2), task_id=f"t{i}",
                              turn_index=0))
    return out


def _single_process_update(policy, cfg, samples, seed):
    from transformers import AutoModelForCausalLM

    from training.losses import PPOClipLoss
    from training.ppo import ppo_update

    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    reference = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                            weight_decay=cfg.optim.weight_decay)
    a = cfg.algorithm
    metrics = ppo_update(model, reference, opt, samples, PPOClipLoss(a.eps_low, a.eps_high, a.dual_clip, a.kl_coef),
                         pad_id=0, device=torch.device("cpu"), temperature=1.0, micro_batch_size=a.micro_batch_size,
                         grad_clip=cfg.optim.grad_clip, seed=seed)
    return model, metrics


def test_split_mode_zero2_two_ranks_equal_one_process_and_engine_gets_the_weights(train_world, ray_local, tmp_path):
    from transformers import AutoTokenizer

    from training.checkpoint import list_checkpoints, verify_checkpoint
    from training.distributed.group import RayPolicy
    from training.session import run_distributed
    from training.distributed.weight_sync import digest
    from orchestrator.engines.hf import HFEngine
    from training.metrics_log import read_metrics

    policy_dir, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy_dir, tasks, **{
        "trainer.total_steps": 2, "run.threads": 1, "algorithm.micro_batch_size": 2,
        "run.compile_cache": str(tmp_path / "cc")}))
    dist = DistributedConfig(backend="ray", mode="split", trainer_workers=2, rollout_workers=1, zero_stage=2,
                             cpus_per_worker=0.5, bucket_mb=1)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = RayPolicy.start(cfg, dist, str(policy_dir), tokenizer, total_steps=3)
    try:
        # 0. every actor compiles into run.compile_cache (Ray's runtime_env; the driver did not set it here)
        for actor in policy.trainers + policy.rollouts:
            env = ray_local.get(actor.__ray_call__.remote(
                lambda self: (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR"))))
            assert env == (str((tmp_path / "cc" / "inductor").resolve()), str((tmp_path / "cc" / "triton").resolve()))
        # 1. ZeRO-2 over 2 gloo ranks = the single-process update (loss is split-invariant)
        samples = _samples(len(tokenizer))
        expected_model, expected = _single_process_update(policy_dir, cfg, samples, seed=7)
        got = policy.update(samples, pad_id=0, temperature=1.0, micro_batch_size=2, ppo_epochs=1, mini_batches=1,
                            old_logprobs="recompute", seed=7,
                            loss={"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 10.0, "kl_coef": 1e-4, "kl_type": "mse"})
        assert got["train/loss"] == pytest.approx(expected["train/loss"], abs=1e-6)
        assert got["train/pg_loss"] == pytest.approx(expected["train/pg_loss"], abs=1e-6)
        assert got["train/grad_norm"] == pytest.approx(expected["train/grad_norm"], rel=1e-4)

        # 2. bucketed broadcast (gloo): the engine now holds exactly the trainer's weights
        assert policy.sync() > 0
        digests = policy.weights_digests()
        assert digests["trainer"] == digests["rollout-0"], digests
        # ... which are the single-process update's (up to float rounding), so greedy
        # generation from the engine equals transformers on the single-process weights
        local = HFEngine(expected_model, tokenizer, device="cpu")
        prompts = [s.prompt_ids for s in samples[:3]]
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        remote_out = policy.engine.generate(prompts, greedy)
        assert [g.token_ids for g in remote_out] == [g.token_ids for g in local.generate(prompts, greedy)]

        # 3. two steps of the distributed loop on the same actors
        run_distributed(cfg, dist, runtime=fake_runtime(), policy=policy)
        metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2]
        assert all(m["time/weight_sync"] > 0 and m["train/samples"] > 0 for m in metrics)
        digests = policy.weights_digests()
        assert digests["trainer"] == digests["rollout-0"]
        last = verify_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
        assert last.step == 2 and (last.path / "deepspeed").is_dir()
        from safetensors.torch import load_file
        saved = load_file(str(last.model_dir / "model.safetensors"))
        assert digest(saved.items()) == digests["trainer"]

        # 4. resume: a third step continues from checkpoint 2 (DeepSpeed state reloaded)
        cfg3 = load_config(None, overrides(tmp_path, policy_dir, tasks, **{
            "trainer.total_steps": 3, "run.threads": 1, "algorithm.micro_batch_size": 2}))
        run_distributed(cfg3, dist, runtime=fake_runtime(), policy=policy)
        assert [m["step"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
        digests = policy.weights_digests()
        assert digests["trainer"] == digests["rollout-0"] != digest(saved.items())

        # 5. the single-process trainer refuses this checkpoint by name, before loading anything
        from training.checkpoint import CheckpointError
        from training.session import run
        cfg4 = load_config(None, overrides(tmp_path, policy_dir, tasks, **{"trainer.total_steps": 4}))
        with pytest.raises(CheckpointError, match=r"step-00000003 was written with distributed.backend=ray"):
            run(cfg4, runtime=fake_runtime())
    finally:
        policy.shutdown()


def test_colocated_engine_in_the_rank_process_takes_the_weights_in_process(train_world, ray_local, tmp_path):
    from transformers import AutoTokenizer

    from training.distributed.group import RayPolicy

    policy_dir, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy_dir, tasks, **{"run.threads": 1, "algorithm.kl_coef": 0}))
    dist = DistributedConfig(backend="ray", mode="colocated", trainer_workers=1, cpus_per_worker=1)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = RayPolicy.start(cfg, dist, str(policy_dir), tokenizer)
    try:
        assert policy.sync_kind == "inprocess" and policy.engine.names == ["trainer-0"]
        before = policy.weights_digests()
        policy.update(_samples(len(tokenizer), n=3), pad_id=0, temperature=1.0, micro_batch_size=4, ppo_epochs=1,
                      mini_batches=1, old_logprobs="recompute", seed=1,
                      loss={"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 10.0, "kl_coef": 0.0, "kl_type": "mse"})
        assert policy.weights_digests()["trainer-0-engine"] == before["trainer-0-engine"]   # not synced yet
        assert policy.sync() >= 0
        after = policy.weights_digests()
        assert after["trainer"] == after["trainer-0-engine"] != before["trainer"]
    finally:
        policy.shutdown()


def test_a_config_asking_for_more_gpus_than_exist_fails_before_starting(ray_local, train_world, tmp_path):
    from training.distributed.group import RayPolicy

    policy_dir, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy_dir, tasks, **{"run.device": "cuda"}))
    dist = DistributedConfig(backend="ray", mode="split", trainer_workers=8, rollout_workers=2, tensor_parallel=4)
    with pytest.raises(DistributedConfigError, match=r"needs 16 GPUs .* has 0"):
        RayPolicy.start(cfg, dist, str(policy_dir), tokenizer=None)


def _kill_and_wait(ray, actor) -> None:
    """`ray.kill` is asynchronous: a call sent right after it can still be served.  Wait
    until the actor refuses calls, so the engine sees a dead actor deterministically."""
    from ray.exceptions import RayActorError

    ray.kill(actor)
    for _ in range(100):
        try:
            ray.get(actor.generate.remote([], None, []), timeout=10)
        except RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_dead_engine_chunks_are_retried_on_the_others_then_named(ray_local):
    from ray.exceptions import RayActorError  # noqa: F401  (the error RayEngine handles)

    from training.distributed.group import RayEngine, RolloutWorkersDead

    @ray_local.remote(num_cpus=0)
    class Echo:
        def ready(self):
            return {"incarnation": (0, 0.0), "version": 0}

        def generate(self, prompts, params, seeds):
            return [(p[0], s) for p, s in zip(prompts, seeds)]

    a, b = Echo.remote(), Echo.remote()
    engine = RayEngine([a, b], ["rollout-0", "rollout-1"], tokenizer=None)
    prompts = [[i] for i in range(5)]
    params = SamplingParams(seed=100)
    assert engine.generate(prompts, params) == [(i, 100 + i) for i in range(5)]
    _kill_and_wait(ray_local, a)
    assert engine.generate(prompts, params) == [(i, 100 + i) for i in range(5)]   # same rows, same seeds
    assert list(engine.dead) == ["rollout-0"]
    _kill_and_wait(ray_local, b)
    with pytest.raises(RolloutWorkersDead, match="rollout-0.*rollout-1"):
        engine.generate(prompts, params)


def test_a_killed_engine_restarts_and_gets_the_current_weights_before_it_serves(ray_local):
    """Engines started with max_restarts, one SIGKILLed mid-call (bench/faults.py): its rows
    are generated again, whole, by the other; Ray restarts it with its start-up weights (version
    0), and it is refreshed to the policy's version before it serves again: no row ever comes
    from version 0.  Alone, an engine killed mid-call is waited for, refreshed, and serves."""
    from faults import kill_actor_on_call
    from training.distributed.group import RayEngine
    from training.distributed.rollout_worker import StaleWeights

    @ray_local.remote(num_cpus=0, max_restarts=2)
    class Versioned:
        """Rows come back as (prompt, seed, the version of the weights that made them)."""

        def __init__(self):
            self.version, self.pid = 0, os.getpid()

        def ready(self):
            return {"incarnation": (self.pid, 0.0), "version": self.version}

        def generate(self, prompts, params, seeds, version=None):
            time.sleep(0.3)
            if version is not None and version != self.version:
                raise StaleWeights(f"holds {self.version}, asked for {version}")
            return [(p[0], s, self.version) for p, s in zip(prompts, seeds)]

        def load(self, version):
            self.version = version

    def make(n):
        workers = [Versioned.remote() for _ in range(n)]
        refreshed = []

        def refresh(names):
            refreshed.append(names)
            ray_local.get([workers[int(x.rsplit("-", 1)[1])].load.remote(engine.version) for x in names])
        engine = RayEngine(workers, [f"rollout-{j}" for j in range(n)], None, refresh=refresh, restart_wait_s=60)
        ray_local.get([w.load.remote(3) for w in workers])
        engine.version = 3
        return engine, workers, refreshed

    prompts, params = [[i] for i in range(6)], SamplingParams(seed=100)
    want = [(i, 100 + i, 3) for i in range(6)]
    engine, (a, _), refreshed = make(2)
    kill = kill_actor_on_call(a, "generate", at=2, name="rollout-0")
    assert engine.generate(prompts, params) == want
    assert engine.generate(prompts, params) == want          # rollout-0 killed with rows 0-2 in flight
    # down, or (when Ray restarted it within the retry's 0.5 s look, as under load) already back
    assert len(kill.killed) == 1 and ("rollout-0" in engine.down or engine.restarted == ["rollout-0"])
    deadline = time.monotonic() + 60
    while not engine.restarted:                               # asked at each call, not waited for
        assert engine.generate(prompts, params) == want
        assert time.monotonic() < deadline, "rollout-0 never came back"
    assert engine.restarted == ["rollout-0"] and refreshed == [["rollout-0"]] and not engine.down
    assert ray_local.get(a.ready.remote())["incarnation"][0] != kill.killed[0][1]   # a new process
    assert engine.generate(prompts, params) == want and kill.calls >= 4              # and it serves

    engine, (only,), refreshed = make(1)
    kill_actor_on_call(only, "generate", at=1)
    assert engine.generate(prompts, params) == want          # waited for the restart, then refreshed
    assert engine.restarted == ["rollout-0"] and refreshed == [["rollout-0"]]
    ray_local.get(only.load.remote(1))                        # an engine that holds other weights
    assert engine.generate(prompts, params) == want and refreshed[-1] == ["rollout-0"] and len(refreshed) == 2


def test_weight_buckets_respect_the_size_limit_and_round_trip():
    from training.distributed.weight_sync import pack, plan_buckets, unpack

    tensors = {"a": torch.randn(256, 256), "b": torch.randn(10), "c": torch.randn(300, 300),
               "d": torch.randn(3, dtype=torch.float64), "e": torch.randn(64)}
    plan = plan_buckets(tensors.items(), bucket_mb=0.3)     # 0.3 MiB = 78,643 floats
    assert [[m.name for m in b.tensors] for b in plan] == [["a", "b"], ["c"], ["e"], ["d"]]
    for bucket in plan:
        for name, view in unpack(bucket, pack(bucket, tensors, "cpu")):
            assert torch.equal(view, tensors[name])
    assert json.dumps([b.numel for b in plan]) == json.dumps([256 * 256 + 10, 300 * 300, 64, 3])


def test_distributed_section_embeds_in_the_training_config():
    """TrainConfig's `distributed:` section is checked like any other (types, unknown keys)."""
    from training.config import ConfigError, TrainConfig, from_dict

    cfg = from_dict(TrainConfig, {"distributed": {"backend": "ray", "zero_stage": 3,
                                                  "engine_args": {"gpu_memory_utilization": 0.5}}}, "")
    assert isinstance(cfg.distributed, DistributedConfig)
    assert cfg.distributed.zero_stage == 3 and cfg.distributed.engine_args == {"gpu_memory_utilization": 0.5}
    with pytest.raises(ConfigError, match=r"distributed.mode: 'both' is not one of"):
        from_dict(TrainConfig, {"distributed": {"mode": "both"}}, "")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['gpus'\]"):
        from_dict(TrainConfig, {"distributed": {"gpus": 8}}, "")


def test_impossible_combinations_fail_before_anything_starts():
    from training.distributed.config import validate_distributed

    cases = [(DistributedConfig(weight_sync="cuda_ipc"), "cpu", "hf", "cuda_ipc needs run.device: cuda"),
             (DistributedConfig(mode="split", weight_sync="inprocess"), "cpu", "hf", "inprocess needs mode: colocated"),
             (DistributedConfig(mode="colocated"), "cuda", "vllm", "cannot share the trainer's process"),
             (DistributedConfig(zero_stage=4), "cpu", "hf", "zero_stage: 1, 2 or 3"),
             (DistributedConfig(trainer_workers=0), "cpu", "hf", "trainer_workers: must be >= 1"),
             (DistributedConfig(rollout_restarts=-1), "cpu", "hf", "rollout_restarts: must be >= 0"),
             (DistributedConfig(restart_wait_s=0), "cpu", "hf", "restart_wait_s: must be > 0")]
    for dist, device, kind, message in cases:
        with pytest.raises(DistributedConfigError, match=message):
            validate_distributed(dist, device=device, engine_kind=kind)


ZERO3_SCRIPT = r'''
import glob, os, sys, torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed
from transformers import LlamaConfig, LlamaForCausalLM
from training.distributed.update import deepspeed_config
from training.samples import TurnSample, collate_samples
from training.ppo import response_logprobs
from training.distributed.train_worker import init_deepspeed
init_deepspeed("gloo")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
ref = LlamaForCausalLM(cfg)
model = LlamaForCausalLM(cfg)
model.load_state_dict(ref.state_dict())
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                  config=deepspeed_config(zero_stage=3, grad_clip=1.0, dtype="float32",
                                                          offload_optimizer=False))
assert hasattr(engine.module.get_output_embeddings().weight, "ds_id"), "not partitioned: not ZeRO-3"
from deepspeed.comm import comm as ds_comm                      # its CPU inference all-reduce: not built
assert ds_comm.cdb.shm_comm_op is None and not glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{sys.argv[1]}_*")
batch = collate_samples([TurnSample(list(range(5, 15)), list(range(20, 28)), [1] * 8, None, 0.5, "t", 0)])
got = response_logprobs(engine.module, batch, 0.7)
want = response_logprobs(ref, batch, 0.7)
assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
engine.backward(-got.sum())
engine.step()
from training.distributed.weight_sync import full_meta, plan_buckets
plan = plan_buckets(((n, full_meta(p)) for n, p in engine.module.named_parameters()), 0.01)
assert plan == plan_buckets(ref.named_parameters(), 0.01), "the sync plan must describe the full weights"
print("ZERO3 OK")
'''


def test_zero3_partitioned_lm_head_gives_the_same_logprobs_and_trains(tmp_path):
    """Under ZeRO-3 every weight is partitioned (empty outside its module's forward): the
    log-prob path must still equal the plain model's and back-propagate, and the weight-sync
    plan must describe the full weights.  (Set up as the trainer ranks are: without DeepSpeed's
    CPU shared-memory op, train_worker.init_deepspeed.)"""
    script = tmp_path / "zero3.py"
    script.write_text(ZERO3_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, str(script), str(29500 + random.randint(100, 900))],
                          capture_output=True, text=True, timeout=600, env=env)
    assert "ZERO3 OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("dtype, engine, want", [("float32", "hf", "float32"), ("bfloat16", "hf", "bfloat16"),
                                                  ("float16", "vllm", "float16")])
def test_rollout_engines_load_the_weights_in_the_dtype_training_computes_in(train_world, tmp_path, dtype, engine, want):
    """A separate engine left to its default (HF: bfloat16 on a GPU) would sample from a
    rounded copy of a float32 policy and never hold the trainer's weights (seen on 2 H200s)."""
    from training.distributed.group import rollout_engine_kwargs

    policy_dir, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy_dir, tasks, **{"model.dtype": dtype, "engine.kind": engine}))
    dist = DistributedConfig(backend="ray", mode="split", engine_args={"max_model_len": 512})
    kwargs = rollout_engine_kwargs(cfg, dist, ipc=False)
    assert kwargs["dtype"] == want and kwargs["max_model_len"] == 512
    assert rollout_engine_kwargs(cfg, DistributedConfig(backend="ray", engine_args={"dtype": "float32"}),
                                 ipc=False)["dtype"] == "float32"          # engine_args win
