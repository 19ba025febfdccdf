"""The quickstart policy's warm start (stage 2 of run.py): a tiny random Llama with SmolLM2's
tokenizer (or the pretrained SmolLM2), warmed up on demonstrations (warmup.py), and tried again
while it does not read the favour line on its own training tasks (reading.py).

    prepare_policy(out, cfg, runtime, demo_tasks, args, indexes) -> (out/policy-warm, {"taught", "tries"})

Each try is seeded alone (`warmup_tries`: the run's seed, then seed + RETRY_SEED_STEP x k), so with
`--parallel-warmup` the pairs (try 2 beside try 1 in a spawned process, `Beside`) give the tries and
the kept policy that one after the other gives.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

from orchestrator.context import Budgets
from orchestrator.loop import Task
from training.config import TrainConfig
from training.quickstart.beside import Beside
from training.quickstart.env import (
    FAVOUR_TRAIN_ALIASES,
    FAVOURED_ALIAS,
    PARAPHRASES,
    PREFERENCE_PREFIX,
    PRESETS,
    WORDINGS,
    evaluation_runtime,
    preference_words,
    with_preference,
)
from training.quickstart.report import console
from training.tasks import load_tasks

RETRY_SEED_STEP = 10_007       # warm-up retries from other initialisations: run.seed + RETRY_SEED_STEP x k


def prepare_policy(out: Path, cfg: TrainConfig, runtime, demo_tasks: list[Task], args,
                   indexes: dict[str, Path] | None = None) -> tuple[Path, dict]:
    """Tiny random policy with SmolLM2's tokenizer, then the supervised warm-up (`warm_up`).

    Returns the warmed-up folder and {"taught": the alias distribution taught (per tool), "tries":
    each warm-up try's seed, favour boost, reading and separation}."""
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from training.quickstart.warmup import (
        demonstrations,
        prompted_alias_choices,
        prompted_alias_prior,
        with_alias_prior,
        with_own_alias_choices,
    )

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    probe = demo_tasks[:16]         # training tasks: the warm-up's own, never held-out ones
    demo_tasks = demonstrated_tasks(demo_tasks, args.demo_presets, cfg.run.seed, args.favour_aliases)
    demos = demonstrations(demo_tasks, tokenizer, runtime.catalog, runtime.retriever, prompts=runtime.prompts,
                           budgets=Budgets(context_tokens=cfg.rollout.context_tokens), topk=runtime.qa.retrieval.topk,
                           tool_spread=args.tool_spread, spread_to=args.spread_to)
    floors = {} if args.search_alias_floor is None else {"search": args.search_alias_floor}
    if args.alias_prior == "per-turn":
        demos = with_own_alias_choices(demos, prompted_alias_choices(demos), floor=args.alias_floor, floors=floors)
    elif args.alias_prior == "pooled":
        demos = with_alias_prior(demos, prompted_alias_prior(demos), floor=args.alias_floor, floors=floors)
    return warm_up(out, cfg, runtime, demos, probe, tokenizer, args, indexes)


def warmup_tries(args) -> list[tuple[int, float]]:
    """(seed offset, favour boost) of each warm-up try: the run's own seed with `--favour-boost`,
    then the same initialisation with `--retry-favour-boost`, then other initialisations with it
    (seed + RETRY_SEED_STEP x k); the pretrained policy is warmed up once."""
    n = args.warmup_tries if args.policy == "tiny" else 1
    return [(0, args.favour_boost)] + [(RETRY_SEED_STEP * (k - 1), args.retry_favour_boost) for k in range(1, n)]


PROBE_LINES = ("favour", "cost", "accuracy", "favour_validation", "cost_validation", "accuracy_validation")


def unread_words(args, tokenizer, demos: list):
    """`--unread-words`' inserter for the warm-up (None when 0); the held-out and validation lines'
    words stay out of its pool, so that they are unseen still."""
    from training.quickstart.warmup import UnreadWords

    if not args.unread_words:
        return None
    keep_out = [preference_words(p, w) for p in PARAPHRASES for w in ("paraphrase", "validation")]
    unread = UnreadWords.build(tokenizer, demos, PREFERENCE_PREFIX, keep_out, args.unread_words)
    console.print(f"warm-up: {args.unread_words} unread words in every preference line, drawn from "
                  f"{len(unread.pool)} the demonstrations never hold")
    return unread


def warm_up(out: Path, cfg: TrainConfig, runtime, demos: list, probe: list[Task], tokenizer, args,
            indexes: dict[str, Path] | None = None) -> tuple[Path, dict]:
    """The supervised warm-up, tried again while its start does not tell the favour line from the
    others on the warm-up's own tasks (`reading.separation` below `--warmup-separation`, in the
    training words and, with `--warmup-validation`, in the validation lines, env.VALIDATION_LINES,
    which the probe reads either way; held-out tasks and paraphrases play no part): the
    warm-up either forms the circuit that reads the line or settles without it (or reads any
    unfamiliar sentence as `favour`), and GRPO amplifies what it finds
    (docs/quickstart.md).  A retry teaches the favoured alias harder (`--retry-favour-boost`), from
    the same initialisation first, then from others (`warmup_tries`).  Where no try separates, the
    one that separated most is kept.  With `--parallel-warmup` (and `indexes`, for the second
    process's runtime) tries run in pairs, the second in a spawned process: the tries and the one
    kept are those of one after the other (each try is seeded alone), a retry costs no extra wall time."""
    from orchestrator.embedded import smollm2_path
    from training.tiny_policy import projected_embeddings

    tiny_table = args.policy == "tiny" and args.embeddings == "smollm2"
    embeddings = projected_embeddings(smollm2_path(), args.hidden) if tiny_table else None
    unread = unread_words(args, tokenizer, demos)
    plan = list(enumerate(warmup_tries(args), start=1))
    pair = 2 if indexes is not None and args.parallel_warmup else 1
    tries = []
    for i in range(0, len(plan), pair):
        here, *there = plan[i:i + pair]
        beside = [Beside(warmup_try_beside, out, cfg, indexes, demos, probe, args, unread, embeddings, *p,
                         what=f"warm-up try {p[0]}'s process (log: {out / f'warmup-try{p[0]}.log'})") for p in there]
        try:
            batch = [warmup_try(out, cfg, runtime, demos, probe, tokenizer, args, unread, embeddings, *here)]
            if batch[0]["separation"] < args.warmup_separation:
                batch += [b.result() for b in beside]
        finally:
            for b in beside:
                b.stop()
        passed = next((t for t in batch if t["separation"] >= args.warmup_separation), None)
        for t in batch[batch.index(passed) + 1:] if passed else []:      # a pair's second try, not needed
            shutil.rmtree(t["model"], ignore_errors=True)
            shutil.rmtree(t["init"], ignore_errors=True)
        for k, t in enumerate(batch[:batch.index(passed) + 1] if passed else batch, start=len(tries) + 1):
            tries.append(t)
            console.print(f"warm-up try {k} (seed {t['seed']}, favour boost {t['favour_boost']}): on training tasks "
                          f"P({FAVOURED_ALIAS}) " + ", ".join(f"{n} {v:.2f}" for n, v in t["reading"].items())
                          + f"; separation {t['separation']:+.2f} (needs >= {args.warmup_separation})")
        if passed:
            break
    return _keep_best(out, tries, tokenizer, args, n_demos=len(demos))


def _keep_best(out: Path, tries: list[dict], tokenizer, args, n_demos: int) -> tuple[Path, dict]:
    """The passing try (else the best) becomes out/policy-warm (its tiny start out/policy-init);
    the other tries' folders go."""
    kept, warm = max(tries, key=lambda t: t["separation"]), out / "policy-warm"
    shutil.rmtree(warm, ignore_errors=True)
    kept["model"].rename(warm)
    if args.policy == "tiny" and kept["init"].exists():
        shutil.rmtree(out / "policy-init", ignore_errors=True)
        kept["init"].rename(out / "policy-init")
    for t in tries:
        shutil.rmtree(t.pop("model"), ignore_errors=True)
        if args.policy == "tiny":
            shutil.rmtree(t["init"], ignore_errors=True)
        t.pop("init")
        t["kept"] = t is kept
    for left in [*out.glob("policy-init-try*"), *out.glob("policy-warm-try*")]:   # a stopped second try's
        shutil.rmtree(left, ignore_errors=True)
    taught = taught_distribution(kept.pop("boosted"), tokenizer)
    for t in tries:
        t.pop("boosted", None)
    console.print(f"warm-up: {n_demos} demonstrated turns, try {tries.index(kept) + 1} kept; alias distribution "
                  f"taught ({args.alias_prior}): {taught}; other tools: {args.tool_spread}")
    return warm, {"taught": taught, "tries": tries}


def warmup_try(out: Path, cfg: TrainConfig, runtime, demos: list, probe: list[Task], tokenizer, args, unread,
               embeddings, k: int, offset_and_boost: tuple[int, float]) -> dict:
    """Warm-up try `k` of `warmup_tries`: its start (out/policy-init-try<k>), its policy
    (out/policy-warm-try<k>) and its reading of the lines on the probe tasks."""
    from orchestrator.embedded import smollm2_path
    from training.quickstart.reading import favour_reading, separation
    from training.quickstart.warmup import supervised_warmup, with_favoured_boost
    from training.tiny_policy import build_tiny_policy

    offset, boost = offset_and_boost
    seed = cfg.run.seed + offset
    if args.policy == "smollm2":      # the shipped SmolLM2-135M-Instruct, pretrained (issue 43 part 4)
        init = smollm2_path()
    else:
        init = build_tiny_policy(out / f"policy-init-try{k}", tokenizer, hidden=args.hidden, layers=args.layers,
                                 heads=4, seed=seed, local_window=args.local_window or None,
                                 global_layers=args.global_layers, embeddings=embeddings)
    boosted = with_favoured_boost(demos, tokenizer, boost)
    model = supervised_warmup(init, out / f"policy-warm-try{k}", boosted, epochs=args.warmup_epochs,
                              lr=args.warmup_lr, batch_size=args.warmup_batch, seed=seed,
                              alias_weight=args.alias_weight, favour_weight=args.favour_weight,
                              device=cfg.run.device, unread=unread, log=console.print)
    reading = favour_reading(model, probe, runtime, topk=runtime.qa.retrieval.topk,
                             budgets=Budgets(context_tokens=cfg.rollout.context_tokens), device=cfg.run.device,
                             lines=PROBE_LINES)
    return {"seed": seed, "favour_boost": boost, "reading": reading,
            "separation": separation(reading, args.warmup_validation), "model": model, "init": Path(init),
            "boosted": boosted}


def warmup_try_beside(out: Path, cfg: TrainConfig, indexes: dict[str, Path], demos: list, probe: list[Task], args,
                      unread, embeddings, k: int, offset_and_boost: tuple[int, float]) -> dict:
    """`warmup_try` as a second process's work: its own runtime and tokenizer, its thread count
    pinned as here, its output to out/warmup-try<k>.log."""
    import contextlib

    import torch
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path

    with (out / f"warmup-try{k}.log").open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
        return warmup_try(out, cfg, evaluation_runtime(cfg, indexes), demos, probe, tokenizer, args, unread,
                          embeddings, k, offset_and_boost)


def taught_distribution(demos: list, tokenizer) -> dict:
    """tool -> preset -> the mean alias distribution the demonstrations teach."""
    from training.quickstart.warmup import _alias_positions

    taught: dict = {}
    for d in demos:
        for pos in _alias_positions(d):
            mean = taught.setdefault(d.tool, {}).setdefault(d.preset or "-", {})
            for t, p in d.targets[pos].items():
                mean.setdefault(tokenizer.decode([t]), []).append(p)
    return {tool: {preset: {a: round(sum(ps) / len(ps), 3) for a, ps in dist.items()} for preset, dist in by.items()}
            for tool, by in taught.items()}


def warmup_tasks(world: dict[str, Path], train_tasks: list[Task], args) -> list[Task]:
    """The tasks the warm-up demonstrates (before `demonstrated_tasks` expands them): the training
    tasks and the extra warm-up split."""
    return train_tasks + (load_tasks([str(world["warmup"])]) if args.warmup_tasks else [])


def demonstrated_tasks(tasks: list[Task], presets: str, seed: int = 0,
                       favour_aliases: list[str] | None = None) -> list[Task]:
    """The warm-up's tasks: each under its own preset (`own`), or each under every preset in turn
    (`all`), `favour` once per alias training lines name (`FAVOUR_TRAIN_ALIASES`): prompts that differ only in the
    preference line (its wording drawn among the training wordings), so that the policy can only
    fit their different alias targets by reading it."""
    if presets == "own":
        return list(tasks)
    if presets == "all":
        rng = random.Random(seed)
        return [with_preference(t, preset, wording=rng.randrange(len(WORDINGS[preset])), favoured=alias)
                for t in tasks for preset in PRESETS
                for alias in ((favour_aliases or FAVOUR_TRAIN_ALIASES) if preset == "favour" else [FAVOURED_ALIAS])]
    raise ValueError(f"--demo-presets {presets!r}: expected 'own' or 'all'")
