"""The quickstart's command line: its flags and their one-line errors (`args(argv)`).

training/quickstart/run.py runs what these flags describe."""
from __future__ import annotations

import argparse
from pathlib import Path

from training.config import AlgorithmConfig
from training.quickstart.env import ANSWER_ALIASES, FAVOUR_TRAIN_ALIASES, FAVOURED_ALIAS

DESCRIPTION = "`make quickstart`: the learning quickstart: GRPO visibly teaches a small orchestrator, on CPU."


class _OneLineErrors(argparse.ArgumentParser):
    """Bad input: one line naming the argument and the fix (no usage dump)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def seed_list(text: str) -> list[int]:
    """--seeds: a count N >= 1 (seeds SEED .. SEED+N-1, today's `make quickstart SEEDS=3`), or a
    comma-separated list of distinct seeds >= 0 ("0,2,4"); returns the offsets/seeds as given,
    resolved against --seed by `seeds_to_run`."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts if p) or not any(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count of seeds (3) or a comma-separated list of "
                                         "distinct seeds (0,2,4)")
    if len(parts) == 1:
        if int(parts[0]) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: a count of seeds must be at least 1 (for seed K alone: "
                                             "--seed K, make quickstart SEED=K)")
        return [-int(parts[0])]             # a count, marked negative
    seeds = [int(p) for p in parts if p]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r}: seed {repeated[0]} is listed more than once; list each seed once")
    return seeds


def seeds_to_run(args) -> list[int]:
    """The seeds --seed / --seeds ask for."""
    if len(args.seeds) == 1 and args.seeds[0] < 0:
        return [args.seed + k for k in range(-args.seeds[0])]
    return list(args.seeds)


# Each policy's learning rates, unread words and GRPO settings, where the flags (and `key=value` overrides) do
# not set them: the tiny random policy's warm-up learns fast from scratch (its GRPO settings:
# training/configs/quickstart.yaml) and is shown words it never reads (its tied table's drift, docs/history.md
# round 8); the pretrained SmolLM2 keeps what it knows with small steps (untuned: the first values tried;
# docs/benchmarks.md), has read every word, and keeps the paper's KL weight it was measured with (the YAML's
# 0.1 is the tiny policy's, round 14)
POLICY_DEFAULTS = {"tiny": {"warmup_epochs": 24, "warmup_lr": 5e-3, "unread_words": 3, "config": {}},
                   "smollm2": {"warmup_epochs": 4, "warmup_lr": 1e-4, "unread_words": 0,
                               # the settings its 12 of 12 checks ran at: the paper's KL weight, 12 steps
                               "config": {"optim.lr": 2e-5, "algorithm.kl_coef": AlgorithmConfig.kl_coef,
                                          "trainer.total_steps": 12}}}


def with_policy_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with POLICY_DEFAULTS[args.policy] where the command line left them unset."""
    defaults = POLICY_DEFAULTS[args.policy]
    for flag in ("warmup_epochs", "warmup_lr", "unread_words"):
        if getattr(args, flag) is None:
            setattr(args, flag, defaults[flag])
    unset = [f"{key}={value}" for key, value in defaults["config"].items()
             if not any(o.startswith(f"{key}=") for o in args.overrides)]
    args.overrides = [*unset, *args.overrides]
    return args


def _warmup_args(parser: argparse.ArgumentParser) -> None:
    """The warm-up's flags (warmup.py): what the starting policy is taught, and how hard."""
    parser.add_argument("--alias-prior", choices=["pooled", "per-turn", "uniform"], default="pooled",
                        help="alias distribution the warm-up teaches: the prompted SmolLM2's, pooled over presets "
                             "(one distribution per tool); the prompted SmolLM2's own choice at each demonstrated "
                             "turn (it reads the preference line); or uniform")
    parser.add_argument("--alias-floor", type=float, default=0.25,
                        help="prompted prior mixed with uniform by this weight (exploration floor)")
    parser.add_argument("--search-alias-floor", type=float, default=None,
                        help="the search tool's floor (default: --alias-floor): the deep search-3, right for year "
                             "questions, is what GRPO must sample to gain accuracy; 0.75 kept fewer checks "
                             "(docs/history.md round 11)")
    parser.add_argument("--tool-spread", type=float, default=0.3,
                        help="share of the warm-up's tool decision given to the tools a question does not need")
    parser.add_argument("--spread-to", choices=["evidence", "all"], default="evidence",
                        help="which tools get --tool-spread: the other evidence tool only (a wasted call first) "
                             "or every other tool (also answering without evidence)")
    parser.add_argument("--demo-presets", choices=["own", "all"], default="all",
                        help="warm-up demonstrations of each task under its own preset only, or under every preset "
                             "(the prompted model's choice under each: prompts that differ only in the preference "
                             "line, so the policy learns to read that line rather than the question)")
    parser.add_argument("--warmup-epochs", type=int, default=None,
                        help="passes over the demonstrated turns (default: POLICY_DEFAULTS, 24 for the tiny policy: 8 "
                             "left the tool decision unlearned in one run; 12, 24 and 32 did not make the start read the "
                             "old preference lines in every seed; the lines' own tokens did: docs/history.md, sixth and "
                             "seventh rounds)")
    parser.add_argument("--warmup-lr", type=float, default=None, help="default: POLICY_DEFAULTS")
    parser.add_argument("--warmup-batch", type=int, default=8)
    parser.add_argument("--unread-words", type=int, default=None,
                        help="warm-up: this many words the warm-up never reads, drawn afresh every epoch, at random "
                             "places of every preference line (default: POLICY_DEFAULTS, 3 for the tiny policy, "
                             "0 for the pretrained one, which has read every word)")
    parser.add_argument("--alias-weight", type=float, default=4.0,
                        help="weight of the alias decisions in the warm-up loss (tool decisions: 1); the answer "
                             "alias's targets are the only ones that differ between preference presets")
    parser.add_argument("--favour-weight", type=float, default=16.0,
                        help="weight of a favour turn's answer alias decision in the warm-up loss (the one "
                             "decision whose target depends on the alias the line names; 4, as --alias-weight, "
                             "left the start unable to read the line in one of two kernel paths of seed 0)")


def _policy_args(parser: argparse.ArgumentParser) -> None:
    """The policy's flags: which model, where it runs, the tiny one's shape and start."""
    parser.add_argument("--policy", choices=["tiny", "smollm2"], default="tiny",
                        help="the policy trained: a tiny random Llama (the CPU quickstart) or the shipped "
                             "SmolLM2-135M-Instruct, pretrained (`make example-pretrained`; a GPU: --device cuda)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the policy runs: warm-up, evaluations, GRPO (run.device)")
    parser.add_argument("--hidden", type=int, default=128, help="tiny policy width")
    parser.add_argument("--layers", type=int, default=2,
                        help="tiny policy depth (which layers are local: --global-layers; 3 with the last one global "
                             "measured, not better: docs/history.md, round 6)")
    parser.add_argument("--local-window", type=int, default=64,
                        help="tiny policy: every layer but the last --global-layers attends to this many previous "
                             "tokens only (0: all layers see the whole prompt)")
    parser.add_argument("--global-layers", type=int, default=0,
                        help="tiny policy: how many last layers read the whole prompt (0, the default: every layer "
                             "local; every decision's preference line is 40-53 tokens back, inside a 64-token window; "
                             "1: the last layer global, the default before round 10, docs/history.md)")
    parser.add_argument("--embeddings", choices=["random", "smollm2"], default="random",
                        help="tiny policy: its token embeddings start random, or as SmolLM2's projected onto their "
                             "--hidden principal directions (words alike start alike; measured, not better: "
                             "docs/history.md, round 7)")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = _OneLineErrors(prog="python -m training.quickstart", description=DESCRIPTION)
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--seed", type=int, default=0, help="run.seed of the (first) run")
    parser.add_argument("--seeds", type=seed_list, default=[-1],
                        help="a count N (seeds SEED .. SEED+N-1) or a list of distinct seeds (0,2,4); more than one "
                        "seed runs each into OUT/seed-K and reports each and the spread")
    parser.add_argument("--recompute", type=Path, metavar="RUN_DIR",
                        help="recompute a finished run's intervals and checks from its saved trajectories and "
                             "compare them with its summary.json (runs nothing)")
    parser.add_argument("--train-tasks", type=int, default=16, help="training tasks (half lookup, half arithmetic)")
    parser.add_argument("--eval-tasks", type=int, default=64,
                        help="held-out tasks (each evaluated under every preference, its paraphrase and the "
                             "unseen tools; the checks' intervals resample these tasks)")
    parser.add_argument("--warmup-tasks", type=int, default=16, help="extra tasks demonstrated in the warm-up")
    parser.add_argument("--balanced-kinds", action=argparse.BooleanOptionalAction, default=False,
                        help="each split's lookups half city, half year questions (default: each at random, so a "
                             "seed's 16 training tasks may hold 2 year questions, or 6). Off by default: on AVX2 seeds 0-4 it "
                             "kept 16 of 20 checks against 18 (docs/history.md round 16)")
    parser.add_argument("--eval-temperature", type=float, default=0.6, help="paper: 0.6 for validation")
    parser.add_argument("--eval-samples", type=int, default=1,
                        help="episodes per held-out task (sampling seeds differ; a task's episodes are resampled "
                             "together)")
    parser.add_argument("--eval-concurrency", type=int, default=32,
                        help="held-out episodes at once (their policy turns batch in the engine)")
    parser.add_argument("--parallel-eval", action=argparse.BooleanOptionalAction, default=True,
                        help="the initial evaluation in a second process beside GRPO (both start from the warm "
                             "policy), the final one in two processes; the same trajectories, both cores busy; "
                             "--no-parallel-eval: all in turn in this one")
    parser.add_argument("--parallel-warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="warm-up tries in pairs, the second in a second process (the same tries and the same "
                             "one kept as in turn: a retry costs no extra wall time on 2 cores); "
                             "--no-parallel-warmup: one after the other")
    parser.add_argument("--favour-boost", type=float, default=0.5,
                        help="warm-up: share of each favour answer turn's alias target moved onto the alias its "
                             "line names (0: the prompted model's choice alone)")
    _policy_args(parser)
    _warmup_args(parser)
    parser.add_argument("--favour-aliases", type=lambda t: t.split(","), default=list(FAVOUR_TRAIN_ALIASES),
                        help="the answer aliases training favour lines name, in turn (comma-separated; must "
                             f"include {FAVOURED_ALIAS}, the held-out tasks' favoured alias)")
    parser.add_argument("--warmup-tries", type=int, default=4,
                        help="tiny policy: warm-ups tried until the start tells the favour line from the others on "
                             "the warm-up's own tasks (1: no retry; the second with --retry-favour-boost, the "
                             "third on from other initialisations too)")
    parser.add_argument("--retry-favour-boost", type=float, default=0.65,
                        help="--favour-boost of the warm-up's retries (a larger gap between the favour turns' "
                             "alias target and the others', so the line is easier to find)")
    parser.add_argument("--warmup-separation", type=float, default=0.25,
                        help="the separation a warm-up must reach: P(answer-4) under favour minus the larger of "
                             "cost's and accuracy's, at the answer alias decision (training/quickstart/reading.py)")
    parser.add_argument("--warmup-validation", action=argparse.BooleanOptionalAction, default=True,
                        help="the separation must also hold in the validation lines (env.VALIDATION_LINES: unfamiliar "
                             "words): a start that sends any unfamiliar sentence to answer-4 is tried again "
                             "(--no-warmup-validation: the training words alone)")
    parser.add_argument("--warmup-only", action="store_true",
                        help="stop after the warm-up and its favour-line reading (training/quickstart/reading.py)")
    parser.add_argument("overrides", nargs="*", help="trainer config overrides, key=value")
    return _checked(parser, with_policy_defaults(parser.parse_args(argv)))


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Values argparse's types do not check: one line naming the flag."""
    for flag in ("eval_tasks", "eval_samples", "eval_concurrency", "train_tasks", "warmup_epochs", "hidden", "layers"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    if args.alias_weight <= 0:
        parser.error(f"--alias-weight {args.alias_weight}: a loss weight, must be > 0")
    unknown = [a for a in args.favour_aliases if a not in ANSWER_ALIASES]
    if unknown or FAVOURED_ALIAS not in args.favour_aliases:
        parser.error(f"--favour-aliases {','.join(args.favour_aliases)}: each one of {', '.join(ANSWER_ALIASES)}, "
                     f"and {FAVOURED_ALIAS} among them")
    if args.embeddings != "random" and args.policy != "tiny":
        parser.error(f"--embeddings {args.embeddings}: starts the tiny policy's table; --policy {args.policy} "
                     "brings its own (drop --embeddings)")
    if args.local_window < 0:
        parser.error(f"--local-window {args.local_window}: tokens a local layer attends to, must be >= 0 "
                     "(0: every layer reads the whole prompt)")
    if args.global_layers < 0 or (args.local_window and args.global_layers >= args.layers):
        parser.error(f"--global-layers {args.global_layers}: 0 .. --layers - 1 ({args.layers - 1}), so that a layer "
                     "is local (--local-window 0: every layer reads the whole prompt already)")
    if args.unread_words < 0:
        parser.error(f"--unread-words {args.unread_words}: words per preference line, must be >= 0 (0: none)")
    if args.unread_words and args.policy != "tiny":
        parser.error(f"--unread-words {args.unread_words}: the tiny policy's warm-up only (its tied table); "
                     f"--policy {args.policy} has read every word (drop --unread-words)")
    if args.favour_weight <= 0:
        parser.error(f"--favour-weight {args.favour_weight}: a loss weight, must be > 0")
    if args.warmup_tries < 1:
        parser.error(f"--warmup-tries {args.warmup_tries}: the number of warm-ups to try, must be >= 1")
    if not -1 <= args.warmup_separation <= 1:
        parser.error(f"--warmup-separation {args.warmup_separation}: a difference of probabilities, must be in [-1, 1]")
    for flag in ("favour_boost", "retry_favour_boost", "alias_floor", "search_alias_floor"):
        if getattr(args, flag) is not None and not 0 <= getattr(args, flag) <= 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: a share, must be in [0, 1]")
    if args.warmup_lr <= 0:
        parser.error(f"--warmup-lr {args.warmup_lr}: a learning rate, must be > 0")
    return args
