"""The pieces of one GRPO step on multi-turn tool rollouts (PAPER.md §4-5).

    groups   = collect_rollouts(tasks, engine, runtime, loop_config, ...)  # G rollouts per task
    scored   = score_groups(tasks, groups, judge, ...)   # outcome -> reward -> filters -> advantages
    samples  = build_turn_samples(scored.rollouts, scored.advantages)     # one per valid turn
    metrics  = ppo_update(model, reference, optimizer, samples, ...)      # clipped PPO + mse KL

`training/train.py` strings them together, top to bottom.

Old log-probs (the PPO ratio's denominator) are *recomputed with the trained model*, not
taken from the engine, by default (`algorithm.old_logprobs: recompute`): the engine's
log-probs are those of the *constrained, temperature-scaled sampler* (renormalised over
the tokens a choice constraint allows), and a vLLM engine computes them with other
kernels/precision, so their ratio to the trainer's log-probs would not be 1 even before
any update.  With 1 PPO epoch and 1 mini-batch (the paper's setting) the weights that
sampled are the weights being updated, so the old log-probs equal the current ones
exactly and we take them from the same forward pass (no extra pass); with more epochs or
mini-batches one extra no-grad pass runs before the first optimizer step.
`old_logprobs: engine` uses the engine's (importance-sampling-style, for unconstrained
decoding with an engine of the same precision).
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.policy import TokenPolicy
from orchestrator.records import LLMResponse, Rollout
from training.algorithms import compute_advantages
from training.filters import group_std_keep_mask, keep_finished
from training.losses import PPOClipLoss
from training.rewards import preference_rewards, reward_inputs
from training.samples import SampleBatch, TurnSample, collate_samples

SUPPORTED_KINDS = ("qa", "tau2")


# ---------------------------------------------------------------------------- tasks
def load_tasks(files: Sequence[str], default_preference: dict[str, float] | None = None) -> list[Task]:
    """Tasks from JSONL / parquet files through HF `datasets`, as `orchestrator.loop.Task`s.

    A record holds `id`, `question`, and optionally `answer`, `kind` ("qa" or "tau2"), `tools`
    ({tool: {alias: model}}), `prices` ({model: {"input", "output"}} $/1M tokens),
    `preference` ({alias | "outcome" | "cost" | "latency": weight}) and `metadata`.
    Mapping fields may also be JSON strings.  Arrow pads the mappings of one file to a
    common schema with nulls; those nulls are dropped again here.  A tau2 record's domain
    folder (`domain_dir`, relative paths taken from the file's folder) is loaded and checked here.
    """
    if not files:
        raise ValueError("data.train_files is empty: list JSONL or parquet task files")
    from datasets import load_dataset

    tasks: list[Task] = []
    for file in files:
        path = Path(file)
        if not path.exists():
            raise FileNotFoundError(f"data.train_files: {file} does not exist")
        kind = "parquet" if path.suffix == ".parquet" else "json"
        rows = load_dataset(kind, data_files=str(path), split="train")
        for i, row in enumerate(rows):
            tasks.append(task_from_record(row, f"{file}[{i}]", default_preference, base=path.parent))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"task id {dup!r} appears more than once in {list(files)}; ids must be unique")
    return tasks


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    return value


def task_from_record(row: dict[str, Any], where: str, default_preference: dict[str, float] | None = None,
                     base: Path | None = None) -> Task:
    """One data record -> Task; errors name the record and field.

    Records written by data_synthesis (`TrainingExample`, recognised by their `instruction`
    field) are adapted through `TrainingExample.loop_task_kwargs`: the policy reads the
    instruction (question + tools, prices and preference in words).  A `kind: tau2` record
    needs `metadata.tau2_task` and `metadata.domain_dir` (TrainingExample: `tau2_task`,
    `domain_dir`); a relative `domain_dir` is taken from `base` (the data file's folder)."""
    if "instruction" in row and "preference_name" in row:
        from pydantic import ValidationError

        from data_synthesis.records import TrainingExample
        try:
            row = TrainingExample.from_row(row).loop_task_kwargs()
        except (ValidationError, ValueError) as exc:
            raise ValueError(f"{where}: not a valid training example: {str(exc).splitlines()[0]}") from None
    for key in ("id", "question"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    fields: dict[str, Any] = {}
    for key in ("tools", "prices", "preference", "metadata"):
        value = row.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: field {key!r} is a string but not JSON ({exc.msg})") from None
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: field {key!r} must be a mapping, got {type(value).__name__}")
        fields[key] = _drop_nulls(value) if value is not None else None
    kind = row.get("kind") or "qa"
    if kind not in SUPPORTED_KINDS:
        raise ValueError(f"{where}: task kind {kind!r} is unknown; field 'kind' must be one of {SUPPORTED_KINDS}")
    answer = row.get("answer")
    task = Task(id=row["id"], question=row["question"], answer=None if answer is None else str(answer),
                kind=kind, tools=fields["tools"], prices=fields["prices"],
                preference=fields["preference"] or dict(default_preference or {}),
                metadata=fields["metadata"] or {})
    if kind == "tau2":
        _resolve_domain(task, where, base)
    return task


def _resolve_domain(task: Task, where: str, base: Path | None) -> None:
    """Make a tau2 task's `domain_dir` absolute and load its domain once (errors name the record)."""
    from data_synthesis.schema import SchemaError
    from orchestrator.domain_episode import task_domain

    domain_dir = task.metadata.get("domain_dir")
    if isinstance(domain_dir, str) and domain_dir and not Path(domain_dir).is_absolute() and base is not None:
        task.metadata["domain_dir"] = str((base / domain_dir).resolve())
    try:
        task_domain(task)
    except (ValueError, SchemaError) as exc:
        raise ValueError(f"{where}: {exc} (domain_dir is relative to the data file's folder; "
                         "`python -m data_synthesis.synthesize --out OUT` writes OUT/dataset/ beside the domain)") from None


class TaskSampler:
    """Epoch-wise shuffled task order; `position` (tasks consumed) is all its state."""

    def __init__(self, n_tasks: int, seed: int, shuffle: bool = True, position: int = 0):
        self.n, self.seed, self.shuffle, self.position = n_tasks, seed, shuffle, position

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return np.random.default_rng([self.seed, epoch]).permutation(self.n).tolist()

    def take(self, k: int) -> list[int]:
        """The next `k` task indices (crossing into the next epoch's order when needed)."""
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(self._order(epoch)[i])
            self.position += 1
        return out

    @property
    def epoch(self) -> float:
        return self.position / self.n


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
    so a rollout's samples do not depend on thread timing or batch composition."""

    def __init__(self, engine, seed: int):
        self._engine, self._seed = engine, seed
        self.tokenizer = engine.tokenizer

    def generate(self, prompts, params):
        params = dataclasses.replace(params, seed=self._seed)
        self._seed += 1
        return self._engine.generate(prompts, params)

    def update_weights(self, state_dict_or_path) -> None:
        self._engine.update_weights(state_dict_or_path)


def rollout_seed(run_seed: int, step: int, task_slot: int, sample: int) -> int:
    """A 62-bit seed for rollout `sample` of the `task_slot`-th task of `step`."""
    return int(np.random.SeedSequence([run_seed, step, task_slot, sample]).generate_state(2, np.uint64)[0] >> 2)


class Preempted(Exception):
    """Raised by `collect_rollouts` when a pre-emption was requested mid-collection."""


def collect_rollouts(tasks: Sequence[Task], engine, runtime, config: LoopConfig, *, rollouts_per_task: int,
                     seed: int, step: int, price_model: str, concurrency: int,
                     should_stop: Callable[[], bool] = lambda: False,
                     on_done: Callable[[int, Rollout], None] | None = None) -> list[list[Rollout]]:
    """G = `rollouts_per_task` episodes of every task, run concurrently; groups in task order.

    Threads overlap generation (batched by a BatchingEngine) with tool calls.  Raises
    `Preempted` soon after `should_stop()` turns true (running episodes are abandoned).
    """
    jobs = [(i, j) for j in range(rollouts_per_task) for i in range(len(tasks))]
    groups: list[list[Rollout | None]] = [[None] * rollouts_per_task for _ in tasks]

    def one(i: int, j: int) -> Rollout:
        policy = TokenPolicy(SeededEngine(engine, rollout_seed(seed, step, i, j)), price_model)
        return run_episode(tasks[i], policy, runtime, config)

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
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
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


def mask_forced_tokens(tasks: Sequence[Task], groups: Sequence[Sequence[Rollout]], catalog, tokenizer,
                       eos_ids: Sequence[int] | None = None, max_string_chars: int | None = None) -> None:
    """Set each turn's `loss_mask` to its `decision_mask` (constrained rollouts only).
    Function-calling turns were constrained by a grammar: its decision mask is replayed
    with xgrammar (`training.engines.grammar`).  `eos_ids`: the ids the engine stops on
    (`training.engines.common.eos_token_ids`; default the tokenizer's), so a choice between
    EOS ids counts as the decision it was at generation.  `max_string_chars`: the grammar's
    string-argument cap at generation (rollout.max_string_chars; default ARG_MAX_CHARS)."""
    from orchestrator.loop import task_catalog
    from orchestrator.toolcall import allowed_call_strings

    cache: dict[str, list[list[int]]] = {}
    for task, group in zip(tasks, groups):
        if task.kind == "tau2":
            _mask_grammar_turns(task, group, catalog, tokenizer, eos_ids, max_string_chars)
            continue
        view = task_catalog(catalog, task)
        allowed = {t.name: list(t.aliases) for t in view.tools if t.kind in ("search", "code", "answer")}
        key = json.dumps(allowed, sort_keys=True)
        if key not in cache:
            cache[key] = choice_token_ids(tokenizer, allowed_call_strings(allowed), eos_ids)
        for rollout in group:
            for turn in rollout.turns:
                if turn.response_ids:
                    turn.loss_mask = decision_mask(turn.response_ids, cache[key])


def _mask_grammar_turns(task: Task, group: Sequence[Rollout], catalog, tokenizer,
                        eos_ids: Sequence[int] | None, max_string_chars: int | None) -> None:
    from orchestrator.domain_episode import task_grammar
    from orchestrator.toolcall import ARG_MAX_CHARS
    from training.engines.grammar import token_grammar

    grammar = task_grammar(task, catalog, max_string_chars or ARG_MAX_CHARS)
    replay = token_grammar(tokenizer, len(tokenizer), list(eos_ids) if eos_ids else [tokenizer.eos_token_id])
    for rollout in group:
        for turn in rollout.turns:
            if turn.response_ids:
                turn.loss_mask = replay.decision_mask(grammar, turn.response_ids)


# ---------------------------------------------------------------------------- rewards
@dataclass
class ScoredBatch:
    rollouts: list[Rollout]                 # kept for training (finished, group std >= min)
    advantages: list[float]                 # one per kept rollout
    rewards: list[list[float]] = field(default_factory=list)   # per group, over finished rollouts
    groups_kept: int = 0


def score_groups(tasks: Sequence[Task], groups: Sequence[Sequence[Rollout]],
                 judge: Callable[[Task, Rollout], bool], *, estimator: str = "grpo",
                 min_group_std: float = 0.1) -> ScoredBatch:
    """Outcome of every rollout, then per group: filter 1 (final answer), preference
    rewards, filter 3 (reward std), advantages.  Sets `Rollout.outcome` (0 or 1) and, on
    finished rollouts, `Rollout.reward`.  `judge` decides QA outcomes (`judged`)."""
    kept: list[Rollout] = []
    rewards_kept: list[float] = []
    group_ids: list[int] = []
    scored = ScoredBatch([], [])
    for g, (task, group) in enumerate(zip(tasks, groups)):
        for rollout in group:
            rollout.outcome = int(rollout.finished and bool(judged(task, rollout, judge)))
        finished = keep_finished(group)
        rewards = preference_rewards([reward_inputs(r) for r in finished], task.preference) if finished else []
        for rollout, reward in zip(finished, rewards):
            rollout.reward = reward
        scored.rewards.append(rewards)
        kept += finished
        rewards_kept += rewards
        group_ids += [g] * len(finished)
    if not kept:
        return scored
    mask = group_std_keep_mask(rewards_kept, group_ids, min_group_std)
    kept_r = [r for r, m in zip(rewards_kept, mask) if m]
    kept_g = [g for g, m in zip(group_ids, mask) if m]
    scored.rollouts = [r for r, m in zip(kept, mask) if m]
    scored.groups_kept = len(set(kept_g))
    if scored.rollouts:
        scored.advantages = compute_advantages(kept_r, kept_g, estimator).tolist()
    return scored


def judged(task: Task, rollout: Rollout, judge: Callable[[Task, Rollout], bool]) -> bool:
    """A finished rollout's outcome: the judge's verdict (QA), or the environment's, which the
    function-calling episode already stored (tau2's task reward, orchestrator/domain_outcome.py)."""
    if task.kind == "tau2":
        return rollout.outcome == 1
    return judge(task, rollout)


def make_judge(kind: str, model: str | None = None) -> Callable[[Task, Rollout], bool]:
    """QA outcome through evaluation.judge: "exact" (upstream's rules), "contains" (+ the
    reference as a whole word of the answer), "llm" (+ `model` as judge via LLM_CALL)."""
    from evaluation.judge import Judge

    judge = Judge(model if kind == "llm" else kind)
    return lambda task, r: judge(task.question, r.final_answer, task.answer or "").correct


# ---------------------------------------------------------------------------- log-probs
def response_logprobs(model, batch: SampleBatch, temperature: float = 1.0) -> torch.Tensor:
    """log p(token t | tokens < t) at every response position of `batch`, 0 elsewhere. [B, L]

    Runs the decoder body over the whole sequence but the LM head (the [*, V] part) only
    at the positions that predict a response token, which is most of the cost saved on
    long prompts.  Logits are divided by the sampling temperature (T > 0), so the
    log-probs are those of the distribution the rollouts were sampled from.
    """
    from training.logprobs import compiled_layers, linear_logprobs

    mask = batch.response_mask.bool()                                          # [B, L]
    rows, cols = mask.nonzero(as_tuple=True)                                   # [N], [N]
    with compiled_layers(model, batch.input_ids.device):                      # CUDA: fused layer kernels
        hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                     use_cache=False).last_hidden_state      # [B, L, H]; no KV cache built
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError(f"{type(model).__name__}: the LM head has a bias; training/logprobs.py assumes none")
    h, targets = hidden[rows, cols - 1], batch.input_ids[rows, cols]                # [N, H], [N]
    if hasattr(head.weight, "ds_id"):
        # DeepSpeed ZeRO-3 partitions the weight; only the module's own forward gathers it
        logits = head(h).float() / (temperature if temperature > 0 else 1.0)       # [N, V]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    else:   # the LM head + log-softmax over chunks of rows: never the full [N, V] float32 logits
        logp = linear_logprobs(h, head.weight, targets, temperature)              # [N]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logp.device)    # [B, L]
    return out.index_put((rows, cols), logp)


def check_logprob_path(model, vocab_size: int, device) -> None:
    """Refuse models whose logits are not just `lm_head(decoder(x))` (e.g. soft-capped)."""
    from training.samples import token_logprobs

    ids = torch.randint(0, vocab_size, (1, 12), device=device)
    batch = SampleBatch(ids, torch.ones_like(ids), torch.zeros_like(ids), None, torch.zeros(1))
    batch.response_mask[:, 6:] = 1
    with torch.no_grad():
        fast = response_logprobs(model, batch)
        full = token_logprobs(model(input_ids=ids).logits, ids) * batch.response_mask
    # half-precision weights: the full logits are rounded to it, ~1e-2 on a log-prob; a
    # soft cap or a logit scale on a real model moves log-probs by whole units
    atol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 5e-2
    if not torch.allclose(fast, full, atol=atol):
        raise ValueError(f"{type(model).__name__}: logits are not lm_head(decoder(x)) "
                         "(soft-capping or scaling?); training/trainer.py response_logprobs needs a path for it")


# ---------------------------------------------------------------------------- update
def _micro_batches(samples: Sequence[TurnSample], size: int) -> list[list[TurnSample]]:
    """Length-sorted chunks (less padding); token-mean over the step keeps the loss split-invariant."""
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    return [order[i:i + size] for i in range(0, len(order), size)]


@torch.no_grad()
def micro_logprobs(model, micro: list[list[TurnSample]], pad_id: int, temperature: float, device):
    """`response_logprobs` of each micro-batch, without gradients (reference / old policy)."""
    return [response_logprobs(model, collate_samples(m, pad_id).to(device), temperature) for m in micro]


def run_ppo_epochs(model, micro: list[list[list[TurnSample]]], tokens: Sequence[int], loss_fn: PPOClipLoss, *,
                   backward: Callable[[torch.Tensor], None], step: Callable[[], float], pad_id: int, device,
                   temperature: float, epochs: int = 1, ref_lp=None, old_lp=None, old_logprobs: str = "recompute",
                   seed: int = 0, filler: Sequence[Sequence[bool]] | None = None):
    """The PPO epochs over prepared micro-batches, shared by `ppo_update` (one process) and
    `training.distributed.update.rank_update` (one DeepSpeed rank).

    micro[k][b]: micro-batch b of mini-batch k; tokens[k]: mini-batch k's trainable tokens
    (every rank's), the loss's divisor.  ref_lp / old_lp: None or [k][b] log-probs (a None
    entry per mini-batch also allowed).  backward(loss) after each micro-batch, step() after
    each mini-batch, returning the gradient norm.  filler[k][b]: padding micro-batches (all
    tokens masked: zero loss) that still run backward but are not counted in the metrics.
    Returns (metric sums, counted micro-batches, grad norms)."""
    rng = np.random.default_rng(seed)
    sums: dict[str, float] = {}
    count, grad_norms = 0, []
    for _ in range(epochs):
        for k in rng.permutation(len(micro)):
            if not micro[k]:        # fewer samples than mini-batches: nothing to step on
                continue
            for b, m in enumerate(micro[k]):
                batch = collate_samples(m, pad_id).to(device)
                logp = response_logprobs(model, batch, temperature)                  # [B, L]
                if old_logprobs == "engine":
                    old = batch.old_logprobs
                else:
                    old = old_lp[k][b] if old_lp is not None and old_lp[k] is not None else logp.detach()
                ref = ref_lp[k][b] if ref_lp is not None and ref_lp[k] is not None else None
                loss, metrics = loss_fn(logp, old, batch.advantages, batch.response_mask, ref, num_tokens=tokens[k])
                backward(loss)
                if filler is not None and filler[k][b]:
                    continue
                for name, value in {"loss": loss, **metrics}.items():
                    sums[name] = sums.get(name, 0.0) + float(value.detach())
                count += 1
            grad_norms.append(step())
    return sums, count, grad_norms


def ppo_update(model, reference, optimizer, samples: Sequence[TurnSample], loss_fn: PPOClipLoss, *,
               pad_id: int, device, temperature: float, micro_batch_size: int, ppo_epochs: int = 1,
               mini_batches: int = 1, grad_clip: float = 1.0, old_logprobs: str = "recompute",
               seed: int = 0, scaler: torch.amp.GradScaler | None = None) -> dict[str, float]:
    """Clipped PPO on per-turn samples; returns means of the loss metrics over micro-batches.

    Each mini-batch is one optimizer step; its loss is the token mean over all of its
    micro-batches (`num_tokens` = the mini-batch's trainable tokens), so the update does
    not depend on `micro_batch_size`.  `scaler` (float16 compute, training/precision.py):
    losses are scaled before backward and gradients unscaled before clipping; a step whose
    gradients overflowed is skipped (its grad norm is reported as inf or nan).
    """
    steps = ppo_epochs * mini_batches
    chunks = np.array_split(np.arange(len(samples)), mini_batches)
    micro_all = [_micro_batches([samples[i] for i in idx], micro_batch_size) for idx in chunks]
    tokens = [sum(sum(s.loss_mask) for m in micro for s in m) for micro in micro_all]
    ref_lp = [micro_logprobs(reference, m, pad_id, temperature, device) for m in micro_all] if reference is not None else None
    old_lp = ([micro_logprobs(model, m, pad_id, temperature, device) for m in micro_all]
              if old_logprobs == "recompute" and steps > 1 else None)

    def backward(loss: torch.Tensor) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step() -> float:
        if scaler is not None:
            scaler.unscale_(optimizer)
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        if scaler is not None:
            scaler.step(optimizer)          # skipped when a gradient is inf / nan
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    optimizer.zero_grad(set_to_none=True)
    sums, count, grad_norms = run_ppo_epochs(model, micro_all, tokens, loss_fn, backward=backward,
                                          step=step, pad_id=pad_id, device=device, temperature=temperature,
                                          epochs=ppo_epochs, ref_lp=ref_lp, old_lp=old_lp,
                                          old_logprobs=old_logprobs, seed=seed)
    out = {f"train/{k}": v / max(1, count) for k, v in sums.items()}
    # per-micro-batch losses are partial sums (divided by the mini-batch's tokens): report the total
    out["train/loss"] = sums.get("loss", 0.0) / max(1, steps)
    out["train/pg_loss"] = sums.get("pg_loss", 0.0) / max(1, steps)
    out["train/kl_loss"] = sums.get("kl_loss", 0.0) / max(1, steps)
    out["train/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    return out


# ---------------------------------------------------------------------------- metrics
def rollout_metrics(groups: Sequence[Sequence[Rollout]]) -> dict[str, float]:
    """Means over every rollout of the step (filters not applied); also per task kind
    (`rollout/accuracy_<kind>`, `rollout/finished_<kind>`, `reward/mean_<kind>`: the mean
    reward of the finished rollouts, as `reward/mean`)."""
    flat = [r for g in groups for r in g]
    n = max(1, len(flat))
    turns = [t for r in flat for t in r.turns]
    out = {
        "rollout/count": float(len(flat)),
        "rollout/accuracy": sum(r.outcome or 0 for r in flat) / n,
        "rollout/finished": sum(r.finished for r in flat) / n,
        "rollout/cost": sum(r.cost for r in flat) / n,
        "rollout/latency": sum(r.latency for r in flat) / n,
        "rollout/turns": len(turns) / n,
        "rollout/valid_turns": sum(t.valid for t in turns) / max(1, len(turns)),
        "rollout/response_tokens": sum(len(t.response_ids or []) for t in turns) / n,
    }
    for r in flat:
        for alias, c in r.tool_calls.items():
            out[f"calls/{alias}"] = out.get(f"calls/{alias}", 0.0) + c / n
    for kind in sorted({r.kind for r in flat}):   # per task kind, e.g. a mixed QA + tau2 run
        of_kind = [r for r in flat if r.kind == kind]
        rewards = [r.reward for r in of_kind if r.reward is not None]
        out[f"rollout/accuracy_{kind}"] = sum(r.outcome or 0 for r in of_kind) / len(of_kind)
        out[f"rollout/finished_{kind}"] = sum(r.finished for r in of_kind) / len(of_kind)
        out[f"reward/mean_{kind}"] = sum(rewards) / max(1, len(rewards))
    return out
