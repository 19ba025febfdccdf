"""Supervised warm-up of the tiny random policy on synthesized demonstrations.

A randomly initialised policy cannot read a question yet, so before GRPO it is taught,
by cross-entropy on a few hundred demonstrated turns, *which tool kind* answers which
question: search then answer for lookups, enhance_reasoning then answer for arithmetic.
The loss uses a demonstrated distribution as its target at every decision: the tool name
(the demonstrated tool, except that at the first turn `tool_spread` of the probability goes
to the tools the question does not need: a prompted small model often starts with the wrong
one), and the alias, a distribution over the tool's aliases.  That alias distribution is
either uniform, or (the quickstart's default) the *prompted* preference of the embedded
SmolLM2-135M-Instruct reading the same prompts (`prompted_alias_prior`, averaged over the
preference presets; or, with `--alias-prior per-turn`, each turn's own choice,
`prompted_alias_choices`, which follows the preference line in part): like the prompted
orchestrators of the paper (§9), it leans on the strongest, priciest expert; mixed with uniform (`floor`) so that no alias is left unexplored.
So the warmed-up policy is "a prompted orchestrator that mostly knows which tool to use"; the
routing, cost and preference behaviour that follows is learned by GRPO from the reward alone.

Each demonstrated turn is what the loop shows at run time: the context rebuilt by
`orchestrator.context.build_messages`, rendered by `orchestrator.chat_template.render_prompt`,
and the canonical tokens of an allowed call + EOS.  Only the positions where constrained
decoding leaves a choice carry a loss, as in the GRPO phase.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from orchestrator.chat_template import render_prompt
from orchestrator.context import (
    Budgets,
    CodeBlock,
    Document,
    EpisodeState,
    Prompts,
    TokenCounter,
    build_messages,
)
from orchestrator.loop import Task, task_catalog
from orchestrator.toolcall import allowed_call_strings, format_tool_call
from training.rollouts import choice_token_ids, decision_mask
from training.samples import TurnSample, collate_samples

EVIDENCE_TOOL = {"lookup": "search", "arithmetic": "enhance_reasoning"}


@dataclass
class Demonstration:
    """One demonstrated turn: the context, one canonical call, and the target distribution
    at each position where the constraint leaves a choice."""

    prompt_ids: list[int]
    response_ids: list[int]                       # the call with the tool's first alias, + EOS
    targets: dict[int, dict[int, float]]          # response position -> {token id: probability}
    tool: str
    preset: str | None = None                     # the task's preference preset (its words end the question)
    favoured: str | None = None                   # under `favour`: the answer alias its words name

    def as_sample(self) -> TurnSample:
        mask = [int(i in self.targets) for i in range(len(self.response_ids))]
        return TurnSample(self.prompt_ids, self.response_ids, mask, None, 0.0, self.tool, 0)


def _targets(response: list[int], choices: list[list[int]], demonstrated: list[list[int]]) -> dict[int, dict[int, float]]:
    """At each decision of `response`: the share of the demonstrated calls (the tool's aliases,
    uniform) that continue the prefix with each token."""
    out = {}
    for i, is_decision in enumerate(decision_mask(response, choices)):
        if not is_decision:
            continue
        through = [c[i] for c in demonstrated if len(c) > i and c[:i] == response[:i]]
        out[i] = {t: through.count(t) / len(through) for t in set(through)}
    return out


def with_tool_spread(targets: dict[int, dict[int, float]], response: list[int], choices: list[list[int]],
                     spread: float, to: list[list[int]] | None = None) -> dict[int, dict[int, float]]:
    """`targets` with the tool decision (the first decision: the tool name's first token) moved
    from certainty to `1 - spread` on the demonstrated tool and `spread` shared equally by the
    other tools the constraint allows there (or, with `to`, only by the tools of those calls):
    the starting policy picks the wrong tool sometimes."""
    if spread <= 0 or not targets:
        return targets
    pos = min(targets)
    options = sorted({c[pos] for c in (choices if to is None else to)
                      if len(c) > pos and c[:pos] == response[:pos]} - {response[pos]})
    if options:
        targets[pos] = {response[pos]: 1 - spread, **{t: spread / len(options) for t in options}}
    return targets


def _turn(tokenizer, catalog, prompts, budgets, state, tool: str, preset: str | None = None,
          tool_spread: float = 0.0, spread_tools: list[str] | None = None,
          favoured: str | None = None) -> Demonstration:
    qa = [t for t in catalog.tools if t.kind in ("search", "code", "answer")]
    messages = build_messages(state, prompts, budgets, TokenCounter(tokenizer))
    prompt = tokenizer(render_prompt(tokenizer, messages, catalog.openai_tools(tools=qa)),
                       add_special_tokens=False)["input_ids"]
    choices = choice_token_ids(tokenizer, allowed_call_strings({t.name: list(t.aliases) for t in qa}))
    demonstrated = choice_token_ids(tokenizer, [format_tool_call(tool, {"model": a})
                                                for a in catalog.tool(tool).aliases])
    to = None if spread_tools is None else choice_token_ids(
        tokenizer, [format_tool_call(name, {"model": a}) for name in spread_tools for a in catalog.tool(name).aliases])
    targets = with_tool_spread(_targets(demonstrated[0], choices, demonstrated), demonstrated[0], choices, tool_spread, to)
    return Demonstration(prompt, demonstrated[0], targets, tool, preset, favoured if preset == "favour" else None)


def _evidence(task: Task, state: EpisodeState, retriever, topk: int) -> None:
    """What the evidence tool would have added: retrieved documents, or a code result."""
    if task.metadata["type"] == "lookup":
        hits = retriever.retrieve([task.question], topk)[0]
        state.add_documents([Document(id=str(h["document"]["id"]), contents=h["document"]["contents"]) for h in hits])
    else:
        expression = task.question.split("What is ", 1)[1].split("?", 1)[0]
        state.code_blocks.append(CodeBlock(code=f"print({expression})", output=task.answer))


def demonstrations(tasks: list[Task], tokenizer, base_catalog, retriever, *, prompts: Prompts,
                   budgets: Budgets, topk: int, tool_spread: float = 0.0,
                   spread_to: str = "evidence") -> list[Demonstration]:
    """Two turns per task: the evidence tool, then (with its result in context) answer; at the
    first turn's tool decision `tool_spread` of the probability goes to the other tools
    (`spread_to` "all": a wasted call, or an answer without the evidence) or to the other evidence
    tool only ("evidence": a wasted call; the prompted model searches for a sum or runs code for
    a name, then must still fetch the right evidence or answer without it)."""
    if spread_to not in ("all", "evidence"):
        raise ValueError(f"spread_to={spread_to!r}: expected 'all' or 'evidence'")
    demos = []
    for task in tasks:
        catalog = task_catalog(base_catalog, task)
        state, preset = EpisodeState(task.question), task.metadata.get("preference_name")
        favoured = task.metadata.get("favoured")
        tool = EVIDENCE_TOOL[task.metadata["type"]]
        wrong = None if spread_to == "all" else [t for t in EVIDENCE_TOOL.values() if t != tool]
        demos.append(_turn(tokenizer, catalog, prompts, budgets, state, tool, preset, tool_spread, wrong, favoured))
        _evidence(task, state, retriever, topk)
        demos.append(_turn(tokenizer, catalog, prompts, budgets, state, "answer", preset, favoured=favoured))
    return demos


def _alias_positions(demo: Demonstration) -> list[int]:
    """Response positions after the tool decision where the demonstrated policy chooses (an alias)."""
    return [i for i in sorted(demo.targets)[1:] if len(demo.targets[i]) > 1]


def _common_prefix(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows) - 1                     # every row keeps at least one token of its own
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows):
            return i
    return n


def next_token_logits(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """The model's next-token logits [V] after each row, each shared prefix read once: the rows
    form a prefix tree, every stretch of tokens that several rows share is run once and its
    key/value cache reused by all of them (the quickstart's rows share the system prompt, and a
    task's rows under the three preference presets share everything up to the preference line).
    Equal to reading each row whole, up to float rounding."""
    import copy

    out: list[torch.Tensor | None] = [None] * len(rows)

    def extended(cache, tokens: list[int]):
        cache = copy.deepcopy(cache)
        return model(input_ids=torch.tensor([tokens], device=model.device), past_key_values=cache,
                     use_cache=True).past_key_values

    def leaf(i: int, done: int, cache) -> None:
        out[i] = model(input_ids=torch.tensor([rows[i][done:]], device=model.device), past_key_values=copy.deepcopy(cache),
                       logits_to_keep=1).logits[0, -1]

    def walk(idx: list[int], done: int, cache) -> None:
        """`idx`'s rows share rows[.][:done], whose keys/values `cache` holds (None: done == 0)."""
        if len(idx) == 1:
            return leaf(idx[0], done, cache)
        shared = _common_prefix([rows[i] for i in idx])
        if shared > done:
            cache, done = extended(cache, rows[idx[0]][done:shared]), shared
        branches: dict[int, list[int]] = {}
        for i in idx:
            branches.setdefault(rows[i][done], []).append(i)
        if len(branches) == 1:             # a row ends one token after the shared part
            ending = [i for i in idx if len(rows[i]) == done + 1]
            for i in ending:
                leaf(i, done, cache)
            rest = [i for i in idx if len(rows[i]) > done + 1]
            return walk(rest, done, cache) if rest else None
        for branch in branches.values():
            walk(branch, done, cache)

    with torch.inference_mode():
        if rows:
            walk(list(range(len(rows))), 0, None)
    return out


def prompted_alias_choices(demos: list[Demonstration]) -> list[dict[int, float]]:
    """The embedded prompted model's alias choice at each demonstration's alias decision:
    SmolLM2-135M-Instruct's next-token distribution there, restricted to the aliases' tokens and
    renormalised ({} for a turn with no alias choice).  Shared prefixes (the system prompt with
    the tool schemas; a turn's prompt under each preset up to its preference line) are read once
    (`next_token_logits`)."""
    from orchestrator.embedded import smollm2_path
    from orchestrator.gateway.backends.transformers_backend import load_model

    picked = [i for i, d in enumerate(demos) if _alias_positions(d)]
    out: list[dict[int, float]] = [{} for _ in demos]
    if not picked:
        return out
    _, model = load_model(str(smollm2_path()))    # the experts' copy: loaded once
    rows = [demos[i].prompt_ids + demos[i].response_ids[:_alias_positions(demos[i])[0]] for i in picked]
    for i, logits in zip(picked, next_token_logits(model, rows)):
        tokens = sorted(demos[i].targets[_alias_positions(demos[i])[0]])
        out[i] = dict(zip(tokens, logits[tokens].float().softmax(-1).tolist()))
    return out


def prompted_alias_prior(demos: list[Demonstration], per_tool: int = 3) -> dict[str, dict[int, float]]:
    """The prompted model's alias preference per tool, pooled: `prompted_alias_choices` at
    `per_tool` demonstrated turns of each tool (taken in turn from each preference preset, so the
    prior is the prompted model's average over the presets, not conditioned on one), averaged."""
    picked = []
    for tool in sorted({d.tool for d in demos}):
        by_preset: dict = {}
        for d in demos:
            if d.tool == tool and _alias_positions(d):
                by_preset.setdefault(d.preset, []).append(d)
        rounds = [d for group in zip(*by_preset.values()) for d in group] if by_preset else []
        picked += rounds[:per_tool]
    pooled: dict[str, list[dict[int, float]]] = {}
    for demo, choice in zip(picked, prompted_alias_choices(picked)):
        pooled.setdefault(demo.tool, []).append(choice)
    return {tool: {t: sum(c[t] for c in cs) / len(cs) for t in cs[0]} for tool, cs in pooled.items()}


def with_alias_prior(demos: list[Demonstration], prior: dict[str, dict[int, float]],
                     floor: float = 0.0, floors: dict[str, float] | None = None) -> list[Demonstration]:
    """The demonstrations with the alias targets replaced by `(1 - floor) * prior + floor / n`
    (per tool, whatever the preset): with `floor` > 0 every alias keeps at least floor / n of the
    probability, so GRPO's few samples per task still try the aliases the prompted model neglects.
    `floors`: {tool: its own floor} for the tools it names."""
    return with_own_alias_choices(demos, [prior.get(d.tool, {}) for d in demos], floor, floors)


def with_own_alias_choices(demos: list[Demonstration], choices: list[dict[int, float]],
                           floor: float = 0.0, floors: dict[str, float] | None = None) -> list[Demonstration]:
    """The demonstrations with each alias target replaced by that turn's own choice
    (`prompted_alias_choices`: it depends on the question and the preference line the turn
    shows), mixed with uniform: `(1 - floor) * choice + floor / n` (`floors[tool]` for a tool it
    names); a turn whose choice is empty or over other tokens keeps its targets."""
    for demo, choice in zip(demos, choices):
        mix = (floors or {}).get(demo.tool, floor)
        for pos in _alias_positions(demo):
            if choice and set(choice) == set(demo.targets[pos]):
                n = len(choice)
                demo.targets[pos] = {t: (1 - mix) * p + mix / n for t, p in choice.items()}
    return demos


@dataclass(frozen=True)
class UnreadWords:
    """`k` words the warm-up never reads, drawn from `pool`, put at random word boundaries of a
    demonstration's preference line (from `marker` to the line's end), afresh every epoch.

    Why: with the output head tied to the token table, every step's softmax moves the row of every
    token the policy is not asked to produce, all by about the same vector, so the words training
    never reads all become one vector, several times a row's starting norm (docs/history.md, round 8):
    an unseen paraphrase reads as that vector repeated, and whether that means `favour` is the
    seed's and the rounding's chance.  Lines holding such words under every preset teach that it
    does not."""

    marker: tuple[int, ...]                 # the line's first tokens ("Preference:")
    ends: frozenset[int]                    # tokens that end a line (a newline in the piece, or a special token)
    word_starts: frozenset[int]             # tokens that start a word (a leading space)
    pool: tuple[int, ...]                   # word tokens no demonstration and no kept-out text holds
    k: int

    @classmethod
    def build(cls, tokenizer, demos: list[Demonstration], prefix: str, keep_out: list[str], k: int) -> UnreadWords:
        """The pool: tokens of a space and 3+ lowercase letters that no demonstrated prompt and none
        of `keep_out` (the held-out and validation lines) contain."""
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        seen = {t for d in demos for t in d.prompt_ids}
        seen |= {t for text in keep_out for t in tokenizer(text, add_special_tokens=False)["input_ids"]}
        pool = tuple(i for i, piece in enumerate(pieces) if i not in seen and piece.startswith("\u0120")
                     and len(piece) > 3 and piece[1:].isalpha() and piece[1:].islower())
        if not pool:
            raise ValueError("no word of the tokenizer is left unread by the demonstrations: no unread words to insert")
        return cls(tuple(tokenizer(prefix, add_special_tokens=False)["input_ids"]),
                   frozenset(i for i, piece in enumerate(pieces) if "\u010a" in piece) | frozenset(tokenizer.all_special_ids),
                   frozenset(i for i, piece in enumerate(pieces) if piece.startswith("\u0120")), pool, k)

    def insert(self, demo: Demonstration, rng: random.Random) -> Demonstration:
        """`demo` with `k` pool tokens in its (last) preference line, each before a word of the line or
        at its end, so never inside an alias; a prompt without the line is returned as it is."""
        ids, m = demo.prompt_ids, list(self.marker)
        starts = [i for i in range(len(ids) - len(m), -1, -1) if ids[i:i + len(m)] == m]
        if not starts or self.k <= 0:
            return demo
        begin = end = starts[0] + len(m)
        while end < len(ids) and ids[end] not in self.ends:
            end += 1
        line = ids[begin:end]
        for _ in range(self.k):
            places = [j for j in range(len(line) + 1) if j == len(line) or line[j] in self.word_starts]
            line.insert(rng.choice(places), rng.choice(self.pool))
        return replace(demo, prompt_ids=ids[:begin] + line + ids[end:])


def with_favoured_boost(demos: list[Demonstration], tokenizer, boost: float) -> list[Demonstration]:
    """Copies of `demos` where each `favour` answer turn's alias target is moved `boost` of the way
    to the alias its line names: `(1 - boost) * target + boost * onehot(favoured)` (`demos` is left
    as it was, so a warm-up retry can boost the same demonstrations again by another amount)."""
    if boost <= 0:
        return list(demos)
    out = []
    for demo in demos:
        if demo.favoured is None or demo.tool != "answer":
            out.append(demo)
            continue
        targets = dict(demo.targets)
        for pos in _alias_positions(demo)[:1]:
            ids = choice_token_ids(tokenizer, [format_tool_call(demo.tool, {"model": demo.favoured})])[0]
            token = ids[pos]
            if ids[:pos] != demo.response_ids[:pos] or token not in demo.targets[pos]:
                raise ValueError(f"favoured alias {demo.favoured!r} is not a choice at the answer turn's alias decision")
            targets[pos] = {t: (1 - boost) * p + (boost if t == token else 0.0) for t, p in demo.targets[pos].items()}
        out.append(replace(demo, targets=targets))
    return out


def decision_loss(model, demos: list[Demonstration], pad_id: int, share_prefix: bool = True,
                  alias_weight: float = 1.0, favour_weight: float | None = None) -> torch.Tensor:
    """Mean over decisions of the cross-entropy between the target and the policy. []

    `alias_weight`: the alias decisions (`_alias_positions`) weigh this much, the tool decisions 1
    (a weighted mean): the only targets that differ between a task's preference presets are its
    answer alias's, a few hundredths of the whole loss at weight 1.  `favour_weight` (None: as
    `alias_weight`): the answer alias decision of a `favour` turn, the one decision whose target
    depends on which alias the line names.

    `share_prefix`: the batch's common prefix (the system prompt with the tool schemas, most of
    every quickstart prompt) runs once and its key/value cache, repeated over the rows, serves
    every row's remainder; the loss and its gradients equal the whole rows' (float rounding)."""
    batch = collate_samples([d.as_sample() for d in demos], pad_id)
    batch.input_ids, batch.attention_mask = batch.input_ids.to(model.device), batch.attention_mask.to(model.device)
    rows, cols = batch.response_mask.bool().nonzero(as_tuple=True)                  # [N], [N]
    shared = _common_prefix([d.prompt_ids + d.response_ids for d in demos]) if share_prefix else 0
    decoder = model.get_decoder()
    if shared:
        cache = decoder(input_ids=batch.input_ids[:1, :shared], use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(demos))
        rest = batch.input_ids[:, shared:]                                           # [B, L - S]
        positions = torch.arange(shared, batch.input_ids.shape[1], device=model.device)[None].expand(len(demos), -1)
        hidden = decoder(input_ids=rest, attention_mask=batch.attention_mask, position_ids=positions,
                         past_key_values=cache, use_cache=True).last_hidden_state    # [B, L - S, H]
    else:
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    logp = model.get_output_embeddings()(hidden[rows, cols - 1 - shared]).float().log_softmax(-1)   # [N, V]
    target = torch.zeros_like(logp)                                                  # [N, V]
    weight = torch.ones(len(rows), device=logp.device)                               # [N]
    for n, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        d = demos[r]
        for token, p in d.targets[c - len(d.prompt_ids)].items():
            target[n, token] = p
        aliases = _alias_positions(d)
        if c - len(d.prompt_ids) in aliases:
            reads = favour_weight is not None and d.favoured is not None and d.tool == "answer" \
                and c - len(d.prompt_ids) == aliases[0]
            weight[n] = favour_weight if reads else alias_weight
    return (-(target * logp).sum(-1) * weight).sum() / weight.sum()


def supervised_warmup(model_dir: Path, out_dir: Path, demos: list[Demonstration], *, epochs: int, lr: float,
                      batch_size: int, seed: int, alias_weight: float = 1.0, favour_weight: float | None = None,
                      device: str = "cpu", unread: UnreadWords | None = None, log=print) -> Path:
    """AdamW on `decision_loss` (alias decisions weighted `alias_weight`, a favour turn's answer
    alias `favour_weight`), lr decaying linearly to 0; saves the policy to `out_dir`.  `unread`:
    every epoch, fresh unread words in every demonstration's preference line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)   # eval: no dropout
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    total = epochs * -(-len(demos) // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    rng = random.Random(seed)
    started = time.monotonic()
    for epoch in range(epochs):
        order = demos[:]
        rng.shuffle(order)
        losses = []
        if unread:
            order = [unread.insert(d, rng) for d in order]
        for i in range(0, len(order), batch_size):
            loss = decision_loss(model, order[i:i + batch_size], tokenizer.pad_token_id, alias_weight=alias_weight,
                                 favour_weight=favour_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
        log(f"warm-up epoch {epoch + 1}/{epochs}: decision loss {sum(losses) / len(losses):.4f} "
            f"({time.monotonic() - started:.0f} s)")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
