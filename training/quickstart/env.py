"""The quickstart's local tool-use world: tasks, tools that differ in price AND capability.

World (data_synthesis/toyworld.py over the data-synthesis `people` domain): 200 fictional people;
three kinds of question, each solvable only through the right tool:
- lookup, city ("In which city was Mira Tallow born?") and year ("In which year ..."): only
  `search` brings the fact into the context;
- arithmetic ("What is 37 * 41 + 12?"): only `enhance_reasoning` (the expert writes Python,
  the sandbox runs it) gives the number.

Aliases differ in capability, with real local components (`SEARCH_DEPTH`): the search aliases
`search-1` and `search-2` (the cheaper two; each alias's model and so its price: `task_tools()`)
read a *shallow* index (a gazetteer: name and birth city only), `search-3` (the dearest) the
*deep* index (the full biographies, years included).  So the cheap search is right for city questions and wrong for
year questions; a policy that routes well pays for the deep search only where it is needed.
The reasoners and answer aliases are equally able (the same greedy SmolLM2-135M-Instruct,
profile `local`) and differ in price.

Preferences (`PRESETS`): every task carries one preference vector, also stated in words on
the question's last line (as data_synthesis states it in `instruction`), drawn for the training
tasks as exact shares (`TRAIN_MIX`); evaluations set one for all held-out tasks.  `favour` is
accuracy + a favoured alias, `answer-4`: every task ends with an answer call and the three answer
aliases are equally able, so `answer-4` is a right choice on every question, and the tasks serve
it as the dearest answer model (`TASK_MODELS`), so nothing but that weight makes
it the best one (`cost` rightly moves answers to `answer-math-2`, `accuracy` is indifferent): its
share rising under `favour` only is the preference being followed.  The prompted SmolLM2 reads
"please use answer-4" (about 0.33 of its answer choice under it, 0.01 otherwise: the warm-up
log's taught distribution with the floor taken out), which the warm-up teaches with each task
demonstrated under every preset (training/quickstart/warm_start.py `demonstrated_tasks`).  The policy
tells the lines apart by their tokens only, so each keeps a token found nowhere else in its
context: "accuracy only." lost that on arithmetic questions, which end "Answer with the number
only." (docs/history.md, seventh round).

Unseen tools (`UNSEEN_TOOLS`): a held-out catalog whose aliases, models and prices never occur
in training (PAPER.md §9), with the same capability split (one deep search alias).

Nothing here reads ../shared or downloads anything.
"""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from data_synthesis.toyworld import build_people, build_tasks
from orchestrator.catalog import load_catalog
from orchestrator.loop import Task
from orchestrator.runtime import ToolRuntime

if TYPE_CHECKING:
    from training.config import TrainConfig

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
# tool -> the aliases of tools.json offered in every quickstart task
TOOL_ALIASES = {
    "search": ["search-1", "search-2", "search-3"],
    "enhance_reasoning": ["reasoner-1", "reasoner-2"],
    "answer": ["answer-1", "answer-4", "answer-math-2"],
}
FAVOURED_ALIAS = "answer-4"
# TASK_MODELS (configs/quickstart_world.yaml): the tasks' own alias -> model choices where they differ from tools.json (per-task
# tool mappings are per-example fields, PAPER.md §2).  Data, not a setting, hence a world file and not in a
# profile: as in data_synthesis's records, a task's alias -> model mapping is part of the task
# (build_world writes it into every record of world/*.jsonl, which training and evaluation read as
# they read any dataset's `tools`), and changing it makes another world, not another run of this one
# (the quickstart's results in docs/benchmarks.md are measured on it).  UNSEEN_TOOLS likewise.
# - the favoured alias is served as the dearest answer model, so `cost` pulls away from it at every
#   step (tools.json: answer-4 = Qwen3-32B, which is cheaper than answer-1's GPT-5 and drew `cost`
#   towards it too, docs/history.md);
# - search-1 is served as Qwen3-8B, a cheap shallow search (tools.json: GPT-5), and the deep search
#   is `search-3` (tools.json's Qwen3-32B, the dearest of the three here, but not GPT-5):
#   - the alias's last token is the decision, and a tiny policy shares one output row per token
#     across tools, so when the deep search was `search-1` the outcome-driven push to it on year
#     questions also pushed `reasoner-1` and `answer-1` (GPT-5) against the cost reward
#     (docs/history.md, fifth round); `3` is a decision no other quickstart tool has;
#   - the quickstart's experts write a few dozen tokens, so the orchestrator's own two ~700-token
#     turns are about 40% of a starting policy's cost, a floor no routing moves; with GPT-5 on the deep search, perfect routing cut the
#     cost by only 41-42% and a policy that sent every lookup to the deep search by 35-40%
#     (docs/history.md, sixth round)
WORLD_FILE = Path(__file__).resolve().parents[2] / "configs" / "quickstart_world.yaml"


def load_world_models(path: Path = WORLD_FILE) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(task_models, unseen_tools) from `path`; every model must be priced in tools.json."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the quickstart world's models: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"task_models", "unseen_tools"}:
        raise ValueError(f"{path}: expected exactly the keys task_models and unseen_tools")
    task_models, unseen = data["task_models"], data["unseen_tools"]
    priced = load_catalog().prices
    models = [*task_models.values(), *(m for per_tool in unseen.values() for m in per_tool.values())]
    for model in models:
        if model not in priced:
            raise ValueError(f"{path}: model {model!r} has no price in tools.json; add it to 'prices' there")
    return task_models, unseen


TASK_MODELS, UNSEEN_TOOLS = load_world_models()
PREFERENCE_PREFIX = "Preference:"
ANSWER_ALIASES = TOOL_ALIASES["answer"]
# The words that state each preference (the question's last line).  Training tasks and the warm-up
# draw among `WORDINGS`; `favour` names the task's own favoured answer alias (`{alias}`, the ones of
# `FAVOUR_TRAIN_ALIASES` in turn).  `PARAPHRASES` occur only in the held-out evaluation (never in training or the
# warm-up): the `favour` check must hold on its paraphrase too (issue 43).
WORDINGS = {
    "accuracy": (f"{PREFERENCE_PREFIX} accuracy alone.",
                 f"{PREFERENCE_PREFIX} only a right answer counts.",
                 f"{PREFERENCE_PREFIX} correctness first, whatever it takes.",
                 f"{PREFERENCE_PREFIX} accuracy, please; any tool may answer.",
                 f"{PREFERENCE_PREFIX} a right answer, given by any tool.",
                 f"{PREFERENCE_PREFIX} accuracy; the reply may come from any tool."),
    "cost": (f"{PREFERENCE_PREFIX} accuracy and low cost.",
             f"{PREFERENCE_PREFIX} a right answer, spending little.",
             f"{PREFERENCE_PREFIX} correct and cheap, please.",
             f"{PREFERENCE_PREFIX} accuracy, please, at a low price.",
             f"{PREFERENCE_PREFIX} a right answer, given cheaply.",
             f"{PREFERENCE_PREFIX} accuracy; the reply should cost little."),
    "favour": (f"{PREFERENCE_PREFIX} accuracy, please use {{alias}} to answer.",
               f"{PREFERENCE_PREFIX} a right answer, given by {{alias}}.",
               f"{PREFERENCE_PREFIX} accuracy; the reply should come from {{alias}}.",
               f"{PREFERENCE_PREFIX} {{alias}} should give the answer.",
               f"{PREFERENCE_PREFIX} correctness, with {{alias}} answering.",
               f"{PREFERENCE_PREFIX} let {{alias}} reply, and be right."),
}
# Lines no training task, demonstration or held-out evaluation uses, sharing no word with
# `PARAPHRASES` (tested): the warm-up's probe reads them on the warm-up's own tasks (reading.py), so
# that a start which sends any unfamiliar sentence to the favoured alias is warmed up again without
# the held-out paraphrases taking part in the choice.
VALIDATION_LINES = {
    "accuracy": f"{PREFERENCE_PREFIX} get it correct; price is no object.",
    "cost": f"{PREFERENCE_PREFIX} correct, and as inexpensive as possible.",
    "favour": f"{PREFERENCE_PREFIX} have {{alias}} respond, correctly.",
}
PARAPHRASES = {
    "accuracy": f"{PREFERENCE_PREFIX} be right; the bill does not matter.",
    "cost": f"{PREFERENCE_PREFIX} be right while keeping the bill small.",
    "favour": f"{PREFERENCE_PREFIX} I would like {{alias}} to write the final answer.",
}


def preference_vector(preset: str, favoured: str = FAVOURED_ALIAS) -> dict[str, float]:
    """The reward's weights for `preset` (`favour`: accuracy + the named answer alias)."""
    return {"accuracy": {"outcome": 1.0}, "cost": {"outcome": 1.0, "cost": 1.0},
            "favour": {"outcome": 1.0, favoured: 1.0}}[preset]


def preference_words(preset: str, wording: int | str = 0, favoured: str = FAVOURED_ALIAS) -> str:
    """The line stating `preset`: training wording number `wording`, "paraphrase" (held-out only) or
    "validation" (the warm-up's probe only)."""
    unseen = {"paraphrase": PARAPHRASES, "validation": VALIDATION_LINES}
    return (unseen[wording][preset] if wording in unseen else WORDINGS[preset][wording]).format(alias=favoured)


# name -> (preference vector, its first wording), `favour` naming the held-out tasks' alias
PRESETS = {name: (preference_vector(name), preference_words(name)) for name in WORDINGS}
TRAIN_MIX = {"cost": 0.4, "favour": 0.4, "accuracy": 0.2}       # share of training tasks per preset
# the aliases training favour lines name, in turn (`--favour-aliases`): the held-out one alone.  Naming
# answer-1 and answer-4 in turn asks the 2-layer policy to copy the alias the line names, a circuit its
# warm-up formed in 3 of 14 runs (seeds x kernel paths x two CPUs, docs/quickstart.md); a fixed alias
# asks it to notice that the line names one, which it learned on every run tried
FAVOUR_TRAIN_ALIASES = [FAVOURED_ALIAS]
MAIN_PRESET = "cost"                                              # the checks' accuracy / cost vector
PREFERENCE = PRESETS[MAIN_PRESET][0]
# alias -> the index its search reads (others: the runtime's defaults)
SHALLOW, DEEP = "shallow", "deep"
SEARCH_DEPTH = {"search-3": DEEP, "search-1": SHALLOW, "search-2": SHALLOW,
                "finder-a": DEEP, "finder-b": SHALLOW}
DESCRIPTIONS = {
    "search": "Search the local corpus for the missing information.",
    "enhance_reasoning": "Write Python code for the problem, run it and return its output.",
    "answer": "Give the final answer.",
}


def quickstart_catalog(out: Path) -> Path:
    """tools.json for the quickstart: the repository's tools, aliases and prices (the one
    price table), with the short `DESCRIPTIONS` instead of the capability prose, and the
    unseen catalog's models served locally too (profile `local`)."""
    catalog = load_catalog()
    data = catalog.model_dump()
    for tool in data["tools"]:
        if tool["name"] in DESCRIPTIONS:
            tool["description"], tool["argument_description"] = DESCRIPTIONS[tool["name"]], ""
    local = data["profiles"]["local"]
    served = next(iter(local.values()))
    for model in [*TASK_MODELS.values(), *(m for per_tool in UNSEEN_TOOLS.values() for m in per_tool.values())]:
        local.setdefault(model, served)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tools.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def task_tools() -> dict[str, dict[str, str]]:
    """The per-task tool mapping (tool -> {alias: model}): the repository's catalog, but for `TASK_MODELS`."""
    catalog = load_catalog()
    return {tool: {a: TASK_MODELS.get(a, catalog.tool(tool).aliases[a].model) for a in aliases}
            for tool, aliases in TOOL_ALIASES.items()}


def with_preference(task: Task, preset: str, tools: dict | None = None, *, wording: int | str = 0,
                    favoured: str = FAVOURED_ALIAS) -> Task:
    """A copy of `task` under preference `preset` (vector + its words on the question's last
    line: training wording number `wording` or "paraphrase"; `favour` naming `favoured`),
    optionally with another tool mapping (the unseen catalog)."""
    question = task.metadata.get("plain_question", task.question)
    words = preference_words(preset, wording, favoured)
    return dataclasses.replace(task, question=f"{question}\n{words}", preference=preference_vector(preset, favoured),
                               tools=tools or task.tools,
                               metadata={**task.metadata, "plain_question": question, "preference_name": preset,
                                         "favoured": favoured, "wording": wording})


def build_world(out: Path, *, n_train: int, n_eval: int, n_warmup: int = 0, n_people: int = 200,
                seed: int = 0, favour_aliases: list[str] | None = None, balanced_kinds: bool = False) -> dict[str, Path]:
    """Write corpus.jsonl (deep), places.jsonl (shallow) and train / eval / warmup .jsonl
    (half lookup, half arithmetic each).

    The splits ask about different people and different numbers; `warmup` holds the tasks
    whose demonstrations the starting policy is taught on (never evaluated).  Training tasks
    get a preset drawn from `TRAIN_MIX`; held-out ones `MAIN_PRESET` (evaluations re-set it).
    A lookup asks city or year at random; with `balanced_kinds` each split's lookups are half
    city, half year (`balanced_lookups`).
    """
    out.mkdir(parents=True, exist_ok=True)
    people = build_people(n_people, seed)
    sizes = {"train": n_train, "eval": n_eval, "warmup": n_warmup}
    counts = [n // 2 for n in sizes.values()]          # each split's lookups
    n_lookup = sum(counts)
    tasks = build_tasks(people, n_lookup, sum(sizes.values()) - n_lookup, seed,
                        cities=sum(n - n // 2 for n in counts) if balanced_kinds else None)
    lookup = [t for t in tasks if t.metadata["type"] == "lookup"]
    if balanced_kinds:
        lookup = balanced_lookups(lookup, counts)
    arith = [t for t in tasks if t.metadata["type"] == "arithmetic"]
    rng = random.Random(seed)
    paths = {"corpus": out / "corpus.jsonl", "places": out / "places.jsonl"}
    paths["corpus"].write_text("".join(json.dumps({"id": p.id, "contents": p.passage()}) + "\n" for p in people))
    paths["places"].write_text("".join(json.dumps({"id": p.id, "contents": f"{p.name}\n{p.name} was born in {p.city}."})
                                       + "\n" for p in people))
    tools = task_tools()
    for name, n in sizes.items():
        kinds = (lookup[:n // 2], arith[:n - n // 2])
        lookup, arith = lookup[n // 2:], arith[n - n // 2:]
        by_kind: dict[str, list[Task]] = {}
        for t in kinds[0] + kinds[1]:
            by_kind.setdefault(question_kind(t), []).append(t)
        split = [with_preference(dataclasses.replace(t, tools=tools), preset)
                 for _, tasks_ in sorted(by_kind.items()) for t, preset in zip(tasks_, _presets(len(tasks_), name, rng))]
        if name != "eval":      # training words: each task one of its preset's wordings, each favour task its alias
            aliases = _cycle(favour_aliases or FAVOUR_TRAIN_ALIASES, sum(t.metadata["preference_name"] == "favour" for t in split), rng)
            split = [with_preference(t, t.metadata["preference_name"], wording=rng.randrange(len(WORDINGS[p])),
                                     favoured=next(aliases) if p == "favour" else FAVOURED_ALIAS)
                     for t in split for p in [t.metadata["preference_name"]]]
        rng.shuffle(split)
        rows = [{**asdict(t), "metadata": json.dumps(t.metadata)} for t in split]
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def balanced_lookups(lookup: list[Task], counts: list[int]) -> list[Task]:
    """`lookup` reordered so that its consecutive slices of `counts` each hold as many city as
    year questions (city the odd one), each kind in its given order (`build_tasks(cities=...)`
    makes exactly enough of each)."""
    pools = {kind: [t for t in lookup if question_kind(t) == kind] for kind in ("city", "year")}
    out = []
    for n in counts:
        for kind, k in (("city", n - n // 2), ("year", n // 2)):
            out += pools[kind][:k]
            del pools[kind][:k]
    return out


def question_kind(task: Task) -> str:
    """"city", "year" or "arithmetic": what the question asks (the tools it needs differ)."""
    return task.id.rsplit("-", 1)[-1] if task.metadata["type"] == "lookup" else task.metadata["type"]


def _cycle(items: list[str], n: int, rng: random.Random):
    """`n` items, each of `items` as often as possible (counts differ by at most one), shuffled."""
    out = [items[i % len(items)] for i in range(n)]
    rng.shuffle(out)
    return iter(out)


def _presets(n: int, split: str, rng: random.Random) -> list[str]:
    """Presets of `n` tasks of one question kind: `MAIN_PRESET` for the held-out split, else
    `TRAIN_MIX`'s shares as exact counts (largest remainders), shuffled, so that a small split
    still holds each preset for each kind of question."""
    if split == "eval":
        return [MAIN_PRESET] * n
    exact = {k: w * n for k, w in TRAIN_MIX.items()}
    counts = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: counts[k] - exact[k])[:n - sum(counts.values())]:
        counts[k] += 1
    out = [k for k, c in counts.items() for _ in range(c)]
    rng.shuffle(out)
    return out


def build_index(corpus: Path, out: Path) -> Path:
    """The MiniLM + FAISS index of the corpus (reused when already built)."""
    from retrieval.build_index import build

    if not (out / "meta.json").exists():
        build(corpus, out, progress=False)
    return out


@dataclasses.dataclass
class RoutedRuntime(ToolRuntime):
    """A ToolRuntime whose aliases differ in capability: `overrides[alias]` replaces runtime
    fields (here: the retriever) for that alias's calls.  Thread-safe: each call runs on a
    shallow copy, so concurrent episodes never see each other's override."""

    overrides: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def call(self, tool_name, alias, state, catalog=None):
        # the experts read the question without the preference line (it is the orchestrator's
        # instruction, not part of the problem); documents and code results still land in
        # `state` (the copy shares its lists)
        plain = dataclasses.replace(state, question=state.question.split(f"\n{PREFERENCE_PREFIX}", 1)[0])
        runtime = dataclasses.replace(self, **self.overrides[alias]) if alias in self.overrides else self
        return ToolRuntime.call(runtime, tool_name, alias, plain, catalog)


EXPERT_TIMEOUT_S = 600.0     # no expert reply is cut short by a busy machine


class UnbatchedExpert:
    """Expert calls that cannot depend on the machine: each runs alone (a `seed` makes the
    in-process gateway run the job unbatched, so a greedy reply does not depend on which other
    requests happened to share its batch) and with a deadline no busy CPU reaches (a reply cut
    at the gateway's wall-clock timeout would change the episode)."""

    def __init__(self, llm):
        self._llm = llm

    def __call__(self, model, messages, **kwargs):
        return self._llm(model, messages, **{"seed": 0, "timeout": EXPERT_TIMEOUT_S, **kwargs})


def routed_runtime(base: ToolRuntime, indexes: dict[str, Path]) -> RoutedRuntime:
    """`base` with each search alias reading its index (`SEARCH_DEPTH`: shallow or deep), and
    its experts unbatched and never timed out (`UnbatchedExpert`; inside the memo if any)."""
    from orchestrator.setup import build_runtime
    from retrieval.client import RetrievalClient
    from training.rollouts import MemoizedLLM

    retrievers = {depth: RetrievalClient.in_process(str(path)) for depth, path in indexes.items()}
    llm = base.llm
    if isinstance(llm, MemoizedLLM):
        llm._llm = UnbatchedExpert(llm._llm)
    else:
        llm = UnbatchedExpert(llm)
    return build_runtime(None, base.sections, base.catalog, retriever=base.retriever, prompts=base.prompts,
                         context_tokens=base.budgets.context_tokens, override_model=base.override_model,
                         serve=base.serve, pricing=base.pricing, llm=llm, run_code=base.run_code, counter=base.counter, cls=RoutedRuntime,
                         overrides={a: {"retriever": retrievers[d]} for a, d in SEARCH_DEPTH.items()})


def evaluation_runtime(cfg: TrainConfig, indexes: dict[str, Path]):
    """The evaluations' runtime: greedy experts memoized too (one cache for all of them: the same
    prompt gets the same reply it would get anyway); their latency is then the wall time of cache
    hits, not the tools'."""
    from training.rollouts import MemoizedLLM
    from training.session import build_runtime

    runtime = routed_runtime(build_runtime(cfg), indexes)
    if not isinstance(runtime.llm, MemoizedLLM):
        runtime.llm = MemoizedLLM(runtime.llm)
    return runtime
