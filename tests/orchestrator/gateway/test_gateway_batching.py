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
    """Queue every job while the batcher is held busy, then release it: deterministic batches."""
    results: list = [None] * len(jobs)

    def go(i):
        try:
            results[i] = batcher.run(jobs[i])
        except Exception as exc:
            results[i] = exc
    with batcher._lock:
        batcher._busy = True
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    while len(batcher._queue) < len(jobs):
        time.sleep(0.01)
    with batcher._lock:
        batcher._busy = False
        batcher._wake.notify_all()
    for t in threads:
        t.join(timeout=30)
    return results


def test_queued_jobs_with_equal_settings_share_one_left_padded_generate():
    model = FakeModel()
    batcher = Batcher(model, pad_id=PAD, max_batch=8)
    jobs = [Job(prompt=[5] * (1 + i), kwargs={"max_new_tokens": 2}, group=("g",)) for i in range(4)]
    results = _run_all(batcher, jobs)
    assert len(model.calls) == 1 and batcher.stats == {"generate_calls": 1, "jobs": 4}
    call = model.calls[0]
    width = 4
    for row, mask in zip(call["ids"], call["mask"]):     # left padding to the longest prompt
        n = sum(mask)
        assert row == [PAD] * (width - n) + [5] * n and mask == [0] * (width - n) + [1] * n
    # each job gets its own row back: [100 + row index, its unpadded prompt length]
    assert sorted(r[0] for r in results) == [100, 101, 102, 103]
    assert [r[1] for r in results] == [1, 2, 3, 4]


def test_different_settings_never_share_a_batch_and_max_batch_is_respected():
    model = FakeModel(delay_s=0.05)
    batcher = Batcher(model, pad_id=PAD, max_batch=2)
    # group 0 prompts are [10], group 1 prompts [11]: a mixed batch would show both in one call
    jobs = [Job(prompt=[10 + i % 2], kwargs={"do_sample": i % 2 == 0}, group=(i % 2,)) for i in range(7)]
    results = _run_all(batcher, jobs)
    assert all(isinstance(r, list) for r in results)
    for call in model.calls:
        assert 1 <= len(call["ids"]) <= 2
        assert len({row[0] for row in call["ids"]}) == 1
    assert sum(len(c["ids"]) for c in model.calls) == 7
    assert len(model.calls) == 4            # groups of 4 and 3 jobs, two per call: 2 + 2 calls
    assert sorted(str(c["kwargs"]["do_sample"]) for c in model.calls) == ["False", "False", "True", "True"]


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
