"""What a quickstart run shows: the training-curves plot and the terminal tables (80 columns)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from training.quickstart.env import FAVOURED_ALIAS, MAIN_PRESET

console = Console()


def plot(metrics_file: Path, initial: dict, final: dict, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.metrics_log import read_metrics

    rows = read_metrics(metrics_file)
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    # the paper's reward is min-max normalised within each group: a group whose rollouts are all right
    # gets no outcome term, so the mean reward falls as training accuracy rises
    panels = [("reward/mean", "reward (train rollouts)\nmin-max per group: all right = no outcome term", None),
              ("rollout/accuracy", "accuracy", "accuracy"),
              ("rollout/cost", "cost per rollout ($)", "cost_per_task")]
    for ax, (key, title, eval_key) in zip(axes, panels):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker="o", label="train rollouts (T=1)")
        if eval_key:
            ax.scatter([0, steps[-1] if steps else 1], [initial[eval_key], final[eval_key]], color="red",
                       zorder=3, label="held-out eval")
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(initial: dict, final: dict, ci: dict, result: dict) -> None:
    """The held-out rows, before -> after, and the checks with their intervals (80 columns)."""
    table = Table(title="held-out tasks, before -> after GRPO", width=80)
    for col in ("preference", "accuracy", "$ / task (1e-4)", f"{FAVOURED_ALIAS} share"):
        table.add_column(col, justify="right")
    for name, f in final.items():
        i = initial[name]
        table.add_row(name.replace("_paraphrase", " (new words)").replace("_", " "),
                      f"{i['accuracy']:.2f} -> {f['accuracy']:.2f}",
                      f"{1e4 * i['cost_per_task']:.2f} -> {1e4 * f['cost_per_task']:.2f}",
                      f"{i['favoured_share']:.2f} -> {f['favoured_share']:.2f}" if name != "unseen_tools" else "-")
    console.print(table)
    print_checks(ci, result)


CHECK_ROWS = (("accuracy_gain", "accuracy gain, cost", "accuracy_up_5_points"),
              ("cost_ratio", "cost after/before, cost", "cost_at_least_40pct_lower"),
              ("share_rise_favour", f"{FAVOURED_ALIAS} share rise, favour", "favoured_share_rises_when_favoured"),
              ("share_rise_favour_paraphrase", "  the same, new words", "favoured_share_rises_when_favoured"),
              ("share_rise_accuracy", "  rise, accuracy", "favoured_share_not_rising_otherwise"),
              ("share_rise_cost", "  rise, cost", "favoured_share_not_rising_otherwise"),
              ("share_rise_accuracy_paraphrase", "  rise, accuracy new words", "favoured_share_not_rising_otherwise"),
              ("share_rise_cost_paraphrase", "  rise, cost new words", "favoured_share_not_rising_otherwise"))


def print_checks(ci: dict, result: dict) -> None:
    table = Table(title="checks: estimate and 95% paired-bootstrap interval", width=80)
    for col, justify in (("statistic", "left"), ("estimate", "right"), ("95% interval", "right"), ("check", "left")):
        table.add_column(col, justify=justify)
    for key, label, check in CHECK_ROWS:
        if key in ci:
            c = ci[key]
            table.add_row(label, f"{c['estimate']:+.3f}", f"[{c['low']:+.3f}, {c['high']:+.3f}]",
                          "-" if check is None else ("holds" if result[check] else "FAILS"))
    console.print(table)
    console.print(f"checks holding: {sum(result.values())} of {len(result)}")


def print_seeds(summary: dict) -> None:
    """One row per seed (80 columns): accuracy, the gain's and the cost ratio's intervals."""
    from rich import box

    table = Table(title=f"quickstart per seed ({MAIN_PRESET} preference; 95% intervals)", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, collapse_padding=True)
    for col in ("seed", "accuracy", "gain [95%]", "cost ratio [95%]", "favour", "checks"):
        table.add_column(col, justify="right")
    for r in summary["seeds"]:
        g, c = r["accuracy_gain"], r["cost_ratio"]
        table.add_row(str(r["seed"]), "{:.2f}->{:.2f}".format(*r["accuracy"]),
                      f"{g['estimate']:+.2f} [{g['low']:+.2f},{g['high']:+.2f}]",
                      f"{c['estimate']:.2f} [{c['low']:.2f},{c['high']:.2f}]",
                      "{:.2f}->{:.2f}".format(*r["favour_share"]), f"{r['checks_holding']}/4")
    console.print(table)
    console.print(f"every seed passes: {summary['all_seeds_pass']}")
