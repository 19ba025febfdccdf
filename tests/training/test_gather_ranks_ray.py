"""gather_ranks (training/distributed/group.py): one call per trainer rank, on local Ray actors.
A dead rank is TrainerWorkerDead (the run restarts from it), also when another rank's error
(gloo's "connection reset" as its peer's process vanishes) reaches the trainer first."""
from __future__ import annotations

import os
import time

import pytest

from training.distributed.group import TrainerWorkerDead, gather_ranks


def _rank_class():
    """Defined in a function so Ray ships the class by value (this test module is not importable
    in its workers)."""
    class Rank:
        def value(self, seconds: float, v):
            time.sleep(seconds)
            return v

        def fail(self, seconds: float):
            time.sleep(seconds)
            raise RuntimeError("[gloo] Connection reset by peer")

        def die(self, seconds: float):
            time.sleep(seconds)
            os._exit(1)
    return Rank


@pytest.fixture
def ranks(ray_local):
    actors = [ray_local.remote(num_cpus=0)(_rank_class()).remote() for _ in range(2)]
    yield actors
    for a in actors:
        ray_local.kill(a)


def test_every_ranks_result_in_rank_order(ranks):
    assert gather_ranks([ranks[0].value.remote(0.3, "a"), ranks[1].value.remote(0.0, "b")]) == ["a", "b"]


def test_a_rank_that_dies_is_trainer_worker_dead_naming_it(ranks):
    with pytest.raises(TrainerWorkerDead, match="trainer rank 1 died") as info:
        gather_ranks([ranks[0].value.remote(30.0, "never"), ranks[1].die.remote(0.2)])
    assert info.value.rank == 1


def test_an_error_arriving_before_the_death_it_comes_from_is_still_the_death(ranks):
    started = time.monotonic()
    with pytest.raises(TrainerWorkerDead, match="trainer rank 1 died") as info:
        gather_ranks([ranks[0].fail.remote(0.1), ranks[1].die.remote(1.5)], death_grace_s=20)
    assert info.value.rank == 1 and time.monotonic() - started < 15   # not the whole grace


def test_an_error_with_every_other_rank_alive_is_that_error(ranks):
    with pytest.raises(RuntimeError, match="Connection reset") as info:
        gather_ranks([ranks[0].fail.remote(0.1), ranks[1].value.remote(0.5, "b")], death_grace_s=20)
    assert not isinstance(info.value, TrainerWorkerDead)
