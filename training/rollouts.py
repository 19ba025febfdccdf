"""Rollout collection for one GRPO step (PAPER.md §4-5): G episodes of every task, run
concurrently, each through its own seeded view of the shared engine; the expert cache; and the
decision masks of constrained turns.

    groups = collect_rollouts(tasks, engine, runtime, loop_config, ...)   # G rollouts per task
    mask_forced_tokens(groups, tokenizer, eos_ids)                       # loss mask = decisions only
"""
from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np

from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.policy import TokenPolicy
from orchestrator.records import LLMResponse, Rollout


# ---------------------------------------------------------------------------- experts
class MemoizedLLM:
    """Caches expert replies by (served model, messages, temperature, max_tokens).

    Only for deterministic (greedy) experts: a repeated prompt then gets the same reply
    and usage it would have got anyway.  The key omits the alias's *priced* model, so
    aliases served by the same local model share entries; cost is still priced per alias
    by the runtime from the recorded usage.  Concurrent misses on one key compute once.
    """

    def __init__(self, llm: Callable[..., LLMResponse]):
        self._llm = llm
        self._cache: dict[str, LLMResponse] = {}
        self._inflight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def entries(self) -> dict[str, LLMResponse]:
        """The cached replies by key, for another process's memo (`preload`)."""
        with self._lock:
            return dict(self._cache)

    def preload(self, entries: dict[str, LLMResponse]) -> None:
        """Adds replies another memo cached (its `entries()`): the same prompts are then hits here."""
        with self._lock:
            self._cache.update(entries)

    def __call__(self, model, messages, **kwargs) -> LLMResponse:
        if kwargs.get("temperature", 0) != 0:
            return self._llm(model, messages, **kwargs)
        key = json.dumps([model, messages, kwargs.get("temperature"), kwargs.get("max_tokens")], sort_keys=True)
        while True:
            with self._lock:
                if key in self._cache:
                    self.hits += 1
                    return self._cache[key]
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = event = threading.Event()
                    self.misses += 1
                    break
            event.wait()     # another thread computes it; then read the cache (or retry on failure)
        try:
            response = self._llm(model, messages, **kwargs)
            with self._lock:
                self._cache[key] = response
            return response
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            event.set()


# ---------------------------------------------------------------------------- rollouts
class SeededEngine:
    """One rollout's view of the shared engine: turn t is sampled with seed `seed + t`,
    so a rollout's samples do not depend on thread timing or batch composition.
    `unconstrained_logprobs`: ask for log-probs before the decoding constraint (asynchronous
    training's behaviour log-probs, `SamplingParams.unconstrained_logprobs`)."""

    def __init__(self, engine, seed: int, unconstrained_logprobs: bool = False):
        self._engine, self._seed = engine, seed
        self._extra = {"unconstrained_logprobs": True} if unconstrained_logprobs else {}
        self.tokenizer = engine.tokenizer

    def generate(self, prompts, params):
        params = dataclasses.replace(params, seed=self._seed, **self._extra)
        self._seed += 1
        return self._engine.generate(prompts, params)

    def update_weights(self, state_dict_or_path) -> None:
        self._engine.update_weights(state_dict_or_path)


def rollout_seed(run_seed: int, step: int, task_slot: int, sample: int) -> int:
    """A 62-bit seed for rollout `sample` of the `task_slot`-th task of `step`."""
    return int(np.random.SeedSequence([run_seed, step, task_slot, sample]).generate_state(2, np.uint64)[0] >> 2)


class Preempted(Exception):
    """Raised by `collect_rollouts` when a pre-emption was requested mid-collection."""


def _checked_price_model_and_slots(tasks, runtime, price_model, slots) -> tuple[str, list[int]]:
    """`collect_rollouts`' price model (default: the catalog's) and task slots (default 0, 1, ...)."""
    price_model = price_model or runtime.catalog.orchestrator_price_model
    if not price_model:
        raise ValueError("the orchestrator's tokens have no price model: set model.price_model in the training "
                         "config or orchestrator_price_model in tools.json")
    slots = list(range(len(tasks))) if slots is None else list(slots)
    if len(slots) != len(tasks):
        raise ValueError(f"collect_rollouts: {len(slots)} slots for {len(tasks)} tasks")
    return price_model, slots


def collect_rollouts(tasks: Sequence[Task], engine, runtime, config: LoopConfig, *, rollouts_per_task: int,
                     seed: int, step: int, price_model: str | None, concurrency: int,
                     should_stop: Callable[[], bool] = lambda: False,
                     on_done: Callable[[int, Rollout], None] | None = None,
                     on_group: Callable[[int, list[Rollout]], None] | None = None,
                     slots: Sequence[int] | None = None,
                     unconstrained_logprobs: bool = False,
                     max_prompt_tokens: int | None = None) -> list[list[Rollout]]:
    """G = `rollouts_per_task` episodes of every task, run concurrently; groups in task order.

    Threads overlap generation (batched by a BatchingEngine) with tool calls; every episode is
    registered with the engine's `episodes()` where it has one, before the first starts
    (BatchingEngine: a short batch may linger for episodes coming back from their tools,
    `engine.linger_ms`).  Raises
    `Preempted` soon after `should_stop()` turns true (running episodes are abandoned).
    `price_model` None: the catalog's `orchestrator_price_model` (tools.json).
    `on_done(i, rollout)` follows each episode's end, `on_group(i, group)` the end of task i's last
    one.  `slots`: the task's place in its step's batch, for the rollout seeds (default 0, 1, ...;
    asynchronous training makes a batch's leftover tasks again after a resume).
    `unconstrained_logprobs`: see `SeededEngine` (asynchronous training).
    `max_prompt_tokens`: each turn's templated prompt is cut in the middle to this many tokens
    (`rollout.prompt_truncation: middle`, as upstream trains); None: sent whole.
    """
    price_model, slots = _checked_price_model_and_slots(tasks, runtime, price_model, slots)
    jobs = [(i, j) for j in range(rollouts_per_task) for i in range(len(tasks))]
    groups: list[list[Rollout | None]] = [[None] * rollouts_per_task for _ in tasks]
    left = [rollouts_per_task] * len(tasks)

    register = getattr(engine, "episodes", None)          # BatchingEngine: all of them, before any starts
    in_flight = register(len(jobs)) if register else None

    def one(i: int, j: int) -> Rollout:
        policy = TokenPolicy(SeededEngine(engine, rollout_seed(seed, step, slots[i], j), unconstrained_logprobs),
                             price_model, max_prompt_tokens=max_prompt_tokens)
        try:
            return run_episode(tasks[i], policy, runtime, config)
        finally:
            if in_flight is not None:
                in_flight.end()

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="rollout")
    try:
        pending = {pool.submit(one, i, j): (i, j) for i, j in jobs}
        while pending:
            done, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            if should_stop():
                raise Preempted()
            for future in done:
                i, j = pending.pop(future)
                groups[i][j] = future.result()
                if on_done is not None:
                    on_done(i, groups[i][j])
                left[i] -= 1
                if on_group is not None and not left[i]:
                    on_group(i, groups[i])  # type: ignore[arg-type]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if in_flight is not None:
            in_flight.close()
    return groups  # type: ignore[return-value]


# ---------------------------------------------------------------------------- constrained turns
def decision_mask(response_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> list[int]:
    """1 where the constraint left the policy a choice, 0 where it forced the token.

    `choices` are the token ids of every allowed response (a call's tokens + EOS).  Under
    constrained decoding a forced token has probability 1 under the sampler, so its
    policy-gradient term is zero: training on it would only add noise.  [len(response_ids)]
    """
    mask = []
    for i, token in enumerate(response_ids):
        prefix = list(response_ids[:i])
        options = {c[i] for c in choices if len(c) > i and list(c[:i]) == prefix}
        mask.append(int(len(options) > 1))
    return mask


def choice_token_ids(tokenizer, choices: Sequence[str], eos_ids: Sequence[int] | None = None) -> list[list[int]]:
    """Token ids of each constrained choice as the engines generate it: the text's ids + an
    EOS, one sequence per EOS id the engine stops on (default: the tokenizer's)."""
    ends = list(eos_ids) if eos_ids else [tokenizer.eos_token_id]
    return [tokenizer(c, add_special_tokens=False)["input_ids"] + [e] for c in choices for e in ends]


def mask_forced_tokens(groups: Sequence[Sequence[Rollout]], tokenizer, eos_ids: Sequence[int] | None = None) -> None:
    """Set each constrained turn's `loss_mask` to its decision mask under the constraint the
    episode recorded on the turn (`Turn.constraint`): `choices` through `decision_mask`, a
    `grammar` replayed with xgrammar (`orchestrator.engines.grammar`).  Nothing is rebuilt from the
    task, so the mask is that of exactly the constraint that sampled the tokens.  `eos_ids`:
    the ids the engine stops on (`orchestrator.engines.common.eos_token_ids`; default the
    tokenizer's), so a choice between EOS ids counts as the decision it was at generation."""
    ends = list(eos_ids) if eos_ids else [tokenizer.eos_token_id]
    choices: dict[str, list[list[int]]] = {}
    replay = None
    for group in groups:
        for rollout in group:
            for turn in rollout.turns:
                if not turn.response_ids or not turn.constraint:
                    continue
                if turn.constraint.get("choices") is not None:
                    key = json.dumps(turn.constraint["choices"])
                    if key not in choices:
                        choices[key] = choice_token_ids(tokenizer, turn.constraint["choices"], ends)
                    turn.loss_mask = decision_mask(turn.response_ids, choices[key])
                elif turn.constraint.get("grammar") is not None:
                    if replay is None:
                        from orchestrator.engines.grammar import token_grammar  # lazy: pulls in torch
                        replay = token_grammar(tokenizer, len(tokenizer), ends)
                    turn.loss_mask = replay.decision_mask(turn.constraint["grammar"], turn.response_ids)
