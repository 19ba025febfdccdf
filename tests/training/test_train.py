"""The training loop end to end on a tiny random policy with scripted experts (CPU, seconds)."""
from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from _train_world import fake_runtime, overrides
from orchestrator.loop import Task
from orchestrator.records import LLMResponse, Rollout, Turn, Usage
from training.checkpoint import list_checkpoints, verify_checkpoint
from training.config import load_config
from training.metrics_log import read_metrics
from training.rollouts import MemoizedLLM, decision_mask
from training.scoring import score_groups
from training.tasks import TaskSampler, load_tasks


def _train(tmp_path, train_world, **extra):
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **extra))
    run(cfg, runtime=fake_runtime())
    return cfg


def test_two_steps_change_the_weights_and_write_checkpoints(tmp_path, train_world):
    cfg = _train(tmp_path, train_world)
    before = load_file(str(train_world[0] / "model.safetensors"))
    found = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in found] == ["step-00000001", "step-00000002"]
    after = load_file(str(found[-1] / "model" / "model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after two PPO steps"
    assert verify_checkpoint(found[-1]).step == 2
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/samples"] > 0 and m["train/grad_norm"] > 0 for m in metrics)
    # the resolved config was saved and loads back to the same config
    assert load_config(tmp_path / "run" / "config.yaml") == cfg


def test_resume_from_step_1_reproduces_the_uninterrupted_losses(tmp_path, train_world):
    _train(tmp_path / "full", train_world, **{"trainer.total_steps": 3})
    full = read_metrics(tmp_path / "full" / "run" / "metrics.jsonl")
    # a second run dir holding only the first checkpoint, as if the job died after step 1
    (tmp_path / "resumed" / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "run" / "checkpoints" / "step-00000001",
                    tmp_path / "resumed" / "run" / "checkpoints" / "step-00000001")
    _train(tmp_path / "resumed", train_world, **{"trainer.total_steps": 3})
    resumed = read_metrics(tmp_path / "resumed" / "run" / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [2, 3]
    for a, b in zip(full[1:], resumed):
        for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/grad_norm", "reward/mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)


def _wandb_records(path):
    """(kind, record) of an offline run's transaction log (run-<id>.wandb): wandb's LevelDB-style
    log of protobuf Records (7-byte ":W&B" header, 32 KiB blocks, 7-byte chunk headers)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, head = path.read_bytes(), 32768, 7
    ident, magic, _ = struct.unpack("<4sHB", data[:head])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a wandb transaction log"
    pos, parts = head, b""
    while pos + head <= len(data):
        if block - pos % block < head:             # block tail too short for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + head])
        if (length, kind) == (0, 0):
            break
        parts += data[pos + head:pos + head + length]
        pos += head + length
        if kind in (1, 4):                         # FULL or LAST chunk: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record.WhichOneof("record_type"), record


def _wandb_history(run_folder):
    """{step: {key: value}} logged by the trainer in one offline-run-* folder, and whether it finished."""
    (log,) = run_folder.glob("run-*.wandb")
    history, finished = {}, False
    for kind, record in _wandb_records(log):
        if kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        finished |= kind == "exit"
    return history, finished


def test_offline_wandb_run_holds_the_metrics_and_resume_continues_it(tmp_path, train_world, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_DIR", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))
    run_dir = tmp_path / "run"
    _train(tmp_path, train_world, **{"logging.wandb": "offline"})            # steps 1-2, finishes wandb
    (first,) = run_dir.glob("wandb/offline-run-*")
    run_id = first.name.rsplit("-", 1)[1]
    history, finished = _wandb_history(first)
    assert finished, "the offline run has no exit record: wandb's finish() did not complete"
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert sorted(history) == [1, 2]
    for m in metrics:   # every number of metrics.jsonl went to wandb at its step
        logged = history[m["step"]]
        for key in ("train/loss", "reward/mean", "rollout/accuracy", "train/samples", "time/step"):
            assert logged[key] == pytest.approx(m[key]), (m["step"], key)
    # the checkpoint keeps the run id ...
    last = list_checkpoints(run_dir / "checkpoints")[-1]
    assert verify_checkpoint(last).load_state()["wandb_id"] == run_id
    # ... and resuming (auto: from step 2) continues that run
    _train(tmp_path, train_world, **{"logging.wandb": "offline", "trainer.total_steps": 3})
    folders = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(f"-{run_id}") for f in folders)
    (second,) = [f for f in folders if f != first]
    history, finished = _wandb_history(second)
    assert finished and sorted(history) == [3]
    assert history[3]["train/loss"] == pytest.approx(read_metrics(run_dir / "metrics.jsonl")[-1]["train/loss"])


def test_a_failing_wandb_finish_is_reported_not_raised(tmp_path, capsys):
    from training.metrics_log import MetricsLogger

    class BrokenRun:
        id = "abc123"

        def finish(self):
            raise TypeError("finish() got an unexpected keyword argument 'quiet'")

    logger = MetricsLogger(tmp_path, config={}, name="n", project="p", wandb_mode="disabled", console=False)
    logger.log(1, {"train/loss": 0.5})
    logger.wandb_run = BrokenRun()
    logger.close()
    logger.close()                     # twice: nothing left to finish
    err = capsys.readouterr().err
    assert "wandb could not finish run abc123" in err and "unexpected keyword argument 'quiet'" in err
    assert err.count("could not finish") == 1
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["train/loss"] == 0.5


def test_tasks_load_through_datasets_with_per_example_tools(tmp_path):
    rows = [{"id": "a", "question": "q1", "answer": 3, "tools": {"search": {"s-1": "gpt-5"}},
             "preference": {"outcome": 1.0, "s-1": 0.5}},
            {"id": "b", "question": "q2", "answer": "x", "tools": json.dumps({"answer": {"a-1": "gpt-5-mini"}})}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = load_tasks([str(path)], default_preference={"outcome": 1.0, "cost": 0.5})
    # Arrow pads the mapping columns of one file to one schema; the nulls must not come back
    assert a.tools == {"search": {"s-1": "gpt-5"}} and a.answer == "3"
    assert a.preference == {"outcome": 1.0, "s-1": 0.5}
    assert b.tools == {"answer": {"a-1": "gpt-5-mini"}}
    assert b.preference == {"outcome": 1.0, "cost": 0.5}   # the config's default


def test_task_kind_that_cannot_train_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "q", "kind": "tau3"}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl\[0\]: task kind 'tau3'"):
        load_tasks([str(path)])


def test_sampler_walks_epochs_deterministically_and_resumes_by_position():
    a = TaskSampler(5, seed=1)
    first = a.take(7)
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]            # one full epoch, then the next
    b = TaskSampler(5, seed=1, position=3)
    assert b.take(4) == first[3:7]


def _rollout(task_id, calls, correct, cost):
    turns = [Turn(index=i, valid=True) for i in range(calls)]
    r = Rollout(task_id=task_id, turns=turns, finished=correct is not None,
                final_answer=None if correct is None else ("4" if correct else "5"))
    r.__dict__["_cost"] = cost
    return r


def test_score_groups_rewards_and_normalises_over_the_whole_group_then_trains_the_finished(monkeypatch):
    monkeypatch.setattr(Rollout, "cost", property(lambda self: self.__dict__["_cost"]))
    task = Task("t", "What is 2 + 2?", answer="4", preference={"outcome": 1.0, "cost": 1.0})
    flat = Task("u", "q", answer="4", preference={"outcome": 1.0})
    group = [_rollout("t", 2, True, 0.001), _rollout("t", 2, True, 0.003),
             _rollout("t", 2, False, 0.002), _rollout("t", 1, None, 0.0)]
    same = [_rollout("u", 1, True, 0.001), _rollout("u", 1, True, 0.001)]
    judge = lambda task, r: r.final_answer == task.answer  # noqa: E731
    scored = score_groups([task, flat], [group, same], judge)
    # all 4 rollouts, the unfinished one at outcome 0: M = [outcome, -cost];
    # outcome (1, 1, 0, 0); -cost (-1e-3, -3e-3, -2e-3, 0) -> min -3e-3, range 3e-3 -> (2/3, 0, 1/3, 1);
    # R = outcome + cost for correct ones: (5/3, 1, 0, 0)
    assert scored.rewards[0] == pytest.approx([5 / 3, 1.0, 0.0, 0.0])
    assert [r.outcome for r in group] == [1, 1, 0, 0] and group[3].reward == 0.0
    # mean 2/3; deviations (1, 1/3, -2/3, -2/3), squares sum 2, sample std sqrt(2/3) = 0.8165;
    # A = (1.2247, 0.4082, -0.8165, -0.8165): the pricier correct answer is still rewarded
    # (over the 3 finishers alone it got 0).  The unfinished rollout is not trained on; the
    # flat group (std 0 < 0.1) is dropped.
    assert scored.groups_kept == 1 and scored.rollouts == group[:3]
    assert scored.advantages == pytest.approx([1.2247449, 0.4082483, -0.8164966], abs=1e-5)


def test_memoized_expert_computes_a_repeated_prompt_once_even_concurrently():
    calls = []

    def slow(model, messages, **kw):
        calls.append(model)
        time.sleep(0.2)
        return LLMResponse(model=model, text="x", usage=Usage(5, 1))
    memo = MemoizedLLM(slow)
    msgs = [{"role": "user", "content": "same prompt"}]
    threads = [threading.Thread(target=memo, args=("m", msgs), kwargs={"temperature": 0.0, "max_tokens": 8,
                                                                       "price_model": f"p{i}"}) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert calls == ["m"] and memo.hits == 3 and memo.misses == 1
    memo("m", msgs, temperature=0.7, max_tokens=8)      # sampled experts are never cached
    assert len(calls) == 2


def test_a_memo_preloaded_with_another_memos_entries_answers_its_prompts_without_calling():
    """The quickstart's initial evaluation memoizes in a second process; its replies join the
    final evaluation's memo (`entries` there, `preload` here) and are hits, not calls."""
    calls = []

    def expert(model, messages, **kw):
        calls.append(messages[0]["content"])
        return LLMResponse(model=model, text=messages[0]["content"].upper(), usage=Usage(5, 1))
    first, second = MemoizedLLM(expert), MemoizedLLM(expert)
    ask = [{"role": "user", "content": "seen"}]
    first("m", ask, temperature=0.0, max_tokens=8)
    second.preload(first.entries())
    assert second("m", ask, temperature=0.0, max_tokens=8).text == "SEEN" and calls == ["seen"] and second.hits == 1
    second("m", [{"role": "user", "content": "new"}], temperature=0.0, max_tokens=8)   # others still call
    assert calls == ["seen", "new"] and set(first.entries()) < set(second.entries())


def test_decision_mask_keeps_only_the_tokens_the_constraint_left_open():
    eos = 9
    choices = [[1, 2, 3, eos], [1, 2, 4, eos], [1, 5, eos]]
    assert decision_mask([1, 2, 3, eos], choices) == [0, 1, 1, 0]   # 2-or-5, then 3-or-4; EOS forced
    assert decision_mask([1, 5, eos], choices) == [0, 1, 0]
    assert decision_mask([1, 2, 3, eos], [[1, 2, 3, eos]]) == [0, 0, 0, 0]


def test_choices_end_with_every_eos_id_the_engine_stops_on():
    """An engine stopping on two EOS ids (Qwen3: <|im_end|>, <|endoftext|>) chose between
    them at the end of a call: the replayed mask must count that choice as generation did."""
    from training.tiny_policy import tiny_tokenizer
    from training.rollouts import choice_token_ids

    tok = tiny_tokenizer(["alpha beta", "alpha gamma"] * 20, 300)
    ids = tok("alpha beta", add_special_tokens=False)["input_ids"]
    other = tok.pad_token_id if tok.pad_token_id != tok.eos_token_id else tok.eos_token_id + 1
    one = choice_token_ids(tok, ["alpha beta", "alpha gamma"])
    two = choice_token_ids(tok, ["alpha beta", "alpha gamma"], [tok.eos_token_id, other])
    assert one == [ids + [tok.eos_token_id], tok("alpha gamma", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    assert len(two) == 4 and ids + [other] in two
    sampled = ids + [other]
    assert decision_mask(sampled, two)[-1] == 1          # the EOS was a choice between two ids
    assert decision_mask(ids + [tok.eos_token_id], one)[-1] == 0    # one EOS id: forced


def test_data_synthesis_training_examples_become_tasks(tmp_path):
    from data_synthesis.records import TrainingExample

    example = TrainingExample(
        id="ex1", kind="qa", domain="frames", question="Who?", instruction="Who? Tools: ... Prefer cheap.",
        answer="Ada", tools={"search": {"s-1": "gpt-5"}, "answer": {"a-1": "Qwen3-32B"}},
        prices={"gpt-5": {"input": 1.0, "output": 8.0}, "Qwen3-32B": {"input": 0.7, "output": 0.7}},
        latency_s={"s-1": 20.0, "a-1": 10.0}, preference={"outcome": 1.0, "cost": 0.5},
        preference_name="cheapest", preference_text="Prefer cheap.", seed=3)
    path = tmp_path / "examples.jsonl"
    path.write_text(json.dumps(example.to_row()) + "\n")
    (task,) = load_tasks([str(path)])
    assert task.question == example.instruction and task.answer == "Ada"
    assert task.tools == example.tools and task.prices["gpt-5"] == {"input": 1.0, "output": 8.0}
    assert task.preference == {"outcome": 1.0, "cost": 0.5}


def test_a_broken_or_non_utf8_jsonl_line_is_one_line_naming_file_and_line(tmp_path):
    good = json.dumps({"id": "a", "question": "q", "answer": "1"})
    for name, body, expect in (
            ("cut.jsonl", f'{good}\n\n{{"id": "b", "question": \n', r"cut\.jsonl:3: not a JSON object \(Expecting value"),
            ("list.jsonl", f"{good}\n[1, 2]\n", r"list\.jsonl:2: a JSON list, not an object"),
            ("latin1.jsonl", f'{good}\n{{"id": "b", "question": "caf\xe9", "answer": "x"}}\n',
             r"latin1\.jsonl: line 2 column 29: not UTF-8 text \(byte 0xe9\); save it as UTF-8")):
        path = tmp_path / name
        path.write_bytes(body.encode("latin-1"))
        with pytest.raises(ValueError, match=expect) as info:
            load_tasks([str(path)])
        assert "\n" not in str(info.value)


def test_a_qa_record_without_an_answer_is_rejected_naming_it(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"id": "a", "question": "q", "answer": "1"}, {"id": "no-ref", "question": "q2"},
            {"id": "blank", "question": "q3", "answer": " "}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    with pytest.raises(ValueError, match=r"t\.jsonl\[1\]: QA task 'no-ref' has no 'answer'"):
        load_tasks([str(path)])
    path.write_text("".join(json.dumps(r) + "\n" for r in (rows[0], rows[2])))
    with pytest.raises(ValueError, match=r"t\.jsonl\[1\]: QA task 'blank' has no 'answer'"):
        load_tasks([str(path)])


def test_a_resume_with_changed_settings_keeps_the_replaced_config_in_config_history(tmp_path, train_world):
    """config.yaml is the latest start's; the config it replaced, with the step it had reached and
    what changed, goes to config_history.jsonl, so the steps logged before keep their settings."""
    import yaml

    _train(tmp_path, train_world, **{"trainer.total_steps": 1})
    first = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert not (tmp_path / "run" / "config_history.jsonl").exists()
    _train(tmp_path, train_world, **{"trainer.total_steps": 2, "optim.lr": "2e-3"})
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optim"]["lr"] == 2e-3
    (entry,) = [json.loads(line) for line in (tmp_path / "run" / "config_history.jsonl").read_text().splitlines()]
    assert entry["config"] == first and entry["step"] == 1 and entry["until"].endswith("Z")
    assert entry["changed"] == {"optim.lr": {"from": 1e-3, "to": 2e-3}, "trainer.total_steps": {"from": 1, "to": 2}}
    _train(tmp_path, train_world, **{"trainer.total_steps": 2, "optim.lr": "2e-3"})   # same settings: no entry
    assert len((tmp_path / "run" / "config_history.jsonl").read_text().splitlines()) == 1
