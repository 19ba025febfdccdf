"""The in-process batcher: concurrent jobs with equal settings share one generate call,
different settings never mix, rows are left-padded, and a failure reaches every job."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from orchestrator.gateway.backends.transformers_batching import Batcher, Job

PAD = 0


class FakeModel:
    """Records each generate call; 'generates' row i as [100 + i, prompt length of the row]."""

    device = torch.device("cpu")

    def __init__(self, delay_s: float = 0.2, fail: bool = False):
        self.calls: list[dict] = []
        self.delay_s, self.fail = delay_s, fail
        self.lock = threading.Lock()

    def generate(self, ids, attention_mask, **kwargs):
        with self.lock:
            self.calls.append({"ids": ids.tolist(), "mask": attention_mask.tolist(), "kwargs": kwargs})
        time.sleep(self.delay_s)                 # long enough for other threads to queue up
        if self.fail:
            raise RuntimeError("out of memory")
        new = torch.tensor([[100 + i, int(attention_mask[i].sum())] for i in range(ids.shape[0])])
        return torch.cat([ids, new], dim=1)


def _run_all(batcher: Batcher, jobs: list[Job]) -> list:
    results: list = [None] * len(jobs)

    def go(i):
        try:
            results[i] = batcher.run(jobs[i])
        except Exception as exc:
            results[i] = exc
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
        time.sleep(0.02)       # the first job leads alone; the rest queue behind it
    for t in threads:
        t.join(timeout=30)
    return results


def test_queued_jobs_with_equal_settings_share_one_left_padded_generate():
    model = FakeModel()
    batcher = Batcher(model, pad_id=PAD, max_batch=8)
    jobs = [Job(prompt=[5] * (1 + i), kwargs={"max_new_tokens": 2}, group=("g",)) for i in range(4)]
    results = _run_all(batcher, jobs)
    assert [len(c["ids"]) for c in model.calls] == [1, 3]      # the leader alone, then the 3 that queued
    second = model.calls[1]
    assert second["ids"] == [[PAD, PAD, 5, 5], [PAD, 5, 5, 5], [5, 5, 5, 5]]   # left padding to width 4
    assert second["mask"] == [[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]]
    # each job gets its own row back: [100 + row, its unpadded prompt length]
    assert results == [[100, 1], [100, 2], [101, 3], [102, 4]]


def test_different_settings_never_share_a_batch_and_max_batch_is_respected():
    model = FakeModel()
    batcher = Batcher(model, pad_id=PAD, max_batch=2)
    jobs = [Job(prompt=[1], kwargs={"do_sample": i % 2 == 0}, group=(i % 2,)) for i in range(7)]
    _run_all(batcher, jobs)
    for call in model.calls:
        assert len(call["ids"]) <= 2
        assert len({call["kwargs"]["do_sample"]}) == 1
    assert sum(len(c["ids"]) for c in model.calls) == 7


def test_deadline_becomes_max_time_and_constraints_apply_per_row():
    model = FakeModel(delay_s=0.0)
    batcher = Batcher(model, pad_id=PAD)
    seen = []
    job = Job(prompt=[1, 2], kwargs={}, group=("c",), deadline=time.monotonic() + 5.0,
              allowed=lambda generated: seen.append(generated) or [7])
    batcher.run(job)
    kwargs = model.calls[0]["kwargs"]
    assert 4.0 < kwargs["max_time"] <= 5.0
    assert kwargs["prefix_allowed_tokens_fn"](0, torch.tensor([1, 2, 9])) == [7]
    assert seen == [(9,)]           # the trie sees only the generated ids, not the prompt


def test_a_failed_generate_reaches_every_job_of_the_batch_and_the_batcher_recovers():
    model = FakeModel(fail=True)
    batcher = Batcher(model, pad_id=PAD)
    results = _run_all(batcher, [Job(prompt=[1], kwargs={}, group=("g",)) for _ in range(3)])
    assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)
    model.fail = False
    assert batcher.run(Job(prompt=[1], kwargs={}, group=("g",))) == [100, 1]


@pytest.mark.parametrize("n", [1, 6])
def test_every_job_finishes_exactly_once(n):
    model = FakeModel(delay_s=0.05)
    batcher = Batcher(model, pad_id=PAD, max_batch=4)
    results = _run_all(batcher, [Job(prompt=[3], kwargs={}, group=("g",)) for _ in range(n)])
    assert all(r is not None and not isinstance(r, Exception) for r in results)
    assert sum(len(c["ids"]) for c in model.calls) == n
