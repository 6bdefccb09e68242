"""What ``sera-opt demo`` concludes: a one-line verdict, and a plot read at a glance."""

from __future__ import annotations

import textwrap

import numpy as np

from .config import ESTIMATORS
from .report import short_label

#: Cosine differences below this are ties (the expected estimator is deterministic, so
#: this only absorbs floating-point noise).
TIE = 1e-9


def _curve(payload: dict, key: str) -> dict[int, float]:
    return {e["budget_per_prompt"]: e["expected_cosine"] for e in payload["results"]
            if e["method"] == key}


def headline_method(payload: dict, peer: str | None) -> str:
    """The allocation the verdict speaks of: the demo's peer (``sera-fair:alpha=1``) when
    the run has it, else SERA on the tracker's estimates."""
    methods = {e["method"].rsplit(" ", 1)[0] for e in payload["results"]}
    wanted = f"{peer}/tracker/corrected" if peer else None
    return wanted if wanted in methods else "sera/tracker/corrected"


def demo_verdict(payload: dict, peer: str | None = None) -> str:
    """One line: how often the headline allocation's batch gradient pointed closer to the
    exact gradient than uniform allocation's at the same budget (expected estimator, over
    both estimators and every budget), by how much on average, and at how many budgets it
    did at least as well as uniform given twice the rollouts."""
    method = headline_method(payload, peer)
    better = worse = 0
    gaps: list[float] = []
    doubled = doubled_of = 0
    for c in payload["config"]["offsets"]:
        uniform = _curve(payload, f"uniform c={c}")
        mine = _curve(payload, f"{method} c={c}")
        for budget, value in mine.items():
            if budget not in uniform:
                continue
            gap = value - uniform[budget]
            gaps.append(gap)
            better += gap > TIE
            worse += gap < -TIE
            if 2 * budget in uniform:
                doubled_of += 1
                doubled += value >= uniform[2 * budget] - TIE
    if not gaps:
        return "Verdict: no setting has both uniform and the compared allocation; nothing to compare."
    label = short_label(method)
    ties = len(gaps) - better - worse
    text = (f"Verdict: {label} aligned the batch gradient with the exact one better than uniform "
            f"in {better} of {len(gaps)} settings (worse in {worse}, tied in {ties}), by "
            f"{np.mean(gaps):+.3f} cosine on average")
    if doubled_of:
        text += (f"; at {doubled} of {doubled_of} budgets it did at least as well as uniform "
                 f"with twice the rollouts")
    # One batch's alignment is not training: say what the default is, and why, beside it.
    return text + (". Alignment is not training: the planner's default stays uniform, which no "
                   "allocation beat through TRL at equal CPU time (README, 'Should you use it?').")


def demo_plot(payload: dict, peer: str | None = None):
    """One panel per estimator: the expected estimator's cosine with the exact gradient
    against rollouts per prompt, for uniform, the headline allocation and SERA on the
    tracker's estimates (solid), and the sampled estimators' mean over draws (dashed); the
    verdict underneath. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    method = headline_method(payload, peer)
    lines = [("uniform", "uniform (MaxRL as published; the planner's default)", "0.45", "o")]
    if method != "sera/tracker/corrected":
        lines.append((method, short_label(method), "tab:blue", "s"))
    lines.append(("sera/tracker/corrected", "SERA (tracker)", "tab:orange", "^"))
    offsets = payload["config"]["offsets"]
    fig, axes = plt.subplots(1, len(offsets), figsize=(6 * len(offsets), 4.6), squeeze=False,
                             sharey=True)
    for ax, c in zip(axes[0], offsets, strict=True):
        for base, label, colour, marker in lines:
            entries = [e for e in payload["results"] if e["method"] == f"{base} c={c}"]
            if not entries:
                continue
            xs = [e["budget_per_prompt"] for e in entries]
            ax.plot(xs, [e["expected_cosine"] for e in entries], color=colour, marker=marker,
                    lw=2, label=label)
            sampled = [e.get("sampled_cosine") for e in entries]
            if all(sampled):
                ax.plot(xs, [s["mean"] for s in sampled], color=colour, lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(payload["config"]["budgets"], [str(b) for b in payload["config"]["budgets"]])
        ax.set_xlabel("rollouts per prompt")
        ax.set_title(f"{ESTIMATORS[c].replace('_', '-')} estimator (c={c})")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("cosine with the exact gradient (higher is better)")
    handles, names = axes[0, 0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", lw=1, ls="--"))
    names.append("dashed: one sampled batch (mean over draws)")
    axes[0, 0].legend(handles, names, fontsize=9, loc="lower right")
    fig.suptitle("Does the batch gradient point where the exact likelihood gradient does? "
                 "(digits classifier; solid: expected estimator)", fontsize=11)
    fig.text(0.5, 0.01, textwrap.fill(demo_verdict(payload, peer), 150), ha="center",
             va="bottom", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
