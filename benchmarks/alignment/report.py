"""The comparison's tables, paired report, verdict and plot."""

from __future__ import annotations

import numpy as np

from sera_opt.benchmarks import _harness

from .config import DEMO_PEER, ESTIMATORS


def _lookup(payload, key: str, nbar: int) -> dict | None:
    for entry in payload["results"]:
        if entry["method"] == key and entry["budget_per_prompt"] == nbar:
            return entry
    return None


def _cell(entry: dict | None, sampled: bool) -> str:
    if entry is None:
        return "-"
    text = f"{entry['expected_cosine']:.3f}"
    if sampled and "sampled_cosine" in entry:
        s = entry["sampled_cosine"]
        spread = f"{s['std']:.3f}" if np.isfinite(s["std"]) else "n/a"
        text += f" ({s['mean']:.3f}±{spread})"
    return text


def short_label(key: str) -> str:
    """A column title for a method key: ``sera/true/corrected/uncapped c=0`` -> ``SERA(true p) no cap``."""
    base = key.rsplit(" ", 1)[0]
    if base == "uniform":
        return "uniform"
    parts = base.split("/")
    policy = "SERA" if parts[0] == "sera" else parts[0]
    source = {"true": "true p", "tracker": "tracker"}.get(parts[1], parts[1])
    label = f"{policy}({source})"
    if "uncorrected" in parts:
        label += " uncorr."
    if "uncapped" in parts:
        label += " no cap"
    return label


def format_table(payload: dict, methods: list[str] | None = None, *,
                 sampled: bool = True) -> str:
    """Cosine similarity to the exact gradient, one row per budget, one column per method.

    Each cell: the expected estimator's cosine, then the sampled estimators'
    mean ± standard deviation over draws.
    """
    budgets = payload["config"]["budgets"]
    if methods is None:
        seen: list[str] = []
        for entry in payload["results"]:
            if entry["method"] not in seen:
                seen.append(entry["method"])
        methods = seen
    header = ["rollouts/prompt"] + [short_label(key) for key in methods]
    body = [[str(nbar)] + [_cell(_lookup(payload, key, nbar), sampled) for key in methods]
            for nbar in budgets]
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


_STYLE = {
    "uniform": ("black", "-", "o"),
    "sera/tracker/corrected": ("tab:blue", "-", "s"),
    "sera/tracker/uncorrected": ("tab:blue", ":", "s"),
    "sera/true/corrected": ("tab:red", "-", "^"),
    "sera/true/uncorrected": ("tab:red", ":", "^"),
    "sera/tracker/corrected/uncapped": ("tab:blue", "-.", "x"),
    "sera/true/corrected/uncapped": ("tab:red", "-.", "x"),
}


#: The lines whose expected cosine gets its interval band (more would hide the curves).
_BANDED = ("uniform", "sera/tracker/corrected")


def plot(payload: dict):
    """Histogram of ``p`` and the alignment curves; returns a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    sp = payload["success_probs"]
    labels = [f"{a:g}-{b:g}" for a, b in zip(sp["bins"][:-1], sp["bins"][1:], strict=True)]
    x = np.arange(len(labels))
    ax = axes[0, 0]
    ax.bar(x - 0.2, sp["true_histogram"], width=0.4, label="true p (current policy)")
    ax.bar(x + 0.2, sp["tracker_histogram"], width=0.4, label="tracker estimate")
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("prompts")
    ax.set_title("success probabilities")
    ax.legend(fontsize=8)

    offsets = payload["config"]["offsets"]
    panels = [(axes[0, 1 + k], c, "expected_cosine", "expected estimator: cosine")
              for k, c in enumerate(offsets[:2])]
    panels += [(axes[1, 0], offsets[0], "expected_relative_error",
                "expected estimator: relative L2 error")]
    panels += [(axes[1, 1 + k], c, "sampled_cosine", "sampled estimator: cosine (mean ± sd)")
               for k, c in enumerate(offsets[:2])]
    peer_colours = _harness.arm_colors(
        dict.fromkeys(e["policy"] for e in payload["results"]))
    for ax, c, metric, title in panels:
        keys = []
        for entry in payload["results"]:
            if entry["offset"] == c and entry["method"] not in keys:
                keys.append(entry["method"])
        for key in keys:
            entries = [e for e in payload["results"] if e["method"] == key and metric in e]
            if not entries:
                continue
            base = key.rsplit(" ", 1)[0]
            policy = base.split("/")[0]
            if base in _STYLE:
                colour, ls, marker = _STYLE[base]
                lw = 2.0
            else:
                if base.endswith("uncorrected"):
                    continue  # keep the plot readable; the JSON has them
                colour, ls, marker, lw = peer_colours[policy], "--", ".", 1.0
            xs = [e["budget_per_prompt"] for e in entries]
            if isinstance(entries[0][metric], dict):
                ys = np.array([e[metric]["mean"] for e in entries])
                sd = np.array([e[metric]["std"] for e in entries])
                if base in _STYLE and "uncorrected" not in base:  # bands for the main lines only
                    ax.fill_between(xs, ys - sd, ys + sd, color=colour, alpha=0.1)
            else:
                ys = np.array([e[metric] for e in entries])
                band = [e.get(f"{metric}_interval") for e in entries]
                if (base in _BANDED and all(band)
                        and all(np.isfinite(b["ci_low"]) for b in band)):
                    # 95 % interval of the mean over batches
                    ax.fill_between(xs, [b["ci_low"] for b in band], [b["ci_high"] for b in band],
                                    color=colour, alpha=0.1)
            ax.plot(xs, ys, color=colour, linestyle=ls, marker=marker, lw=lw,
                    label=short_label(key))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollouts per prompt (budget / M)")
        ax.set_title(f"{title}, {ESTIMATORS[c].replace('_', '-')} (c={c})"
                     + ("\nbands: 95 % interval of the mean over batches (uniform, SERA(tracker))"
                        if metric == "expected_cosine" else ""), fontsize=10)
        ax.grid(alpha=0.3)
    handles, names = axes[0, 1].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=6, fontsize=9, frameon=False)
    fig.suptitle("Alignment of MaxRL gradient estimates with the exact likelihood gradient "
                 "(digits classifier)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


DEMO_COLUMNS = {
    0: ["uniform c=0", f"{DEMO_PEER}/tracker/corrected c=0", "sera/tracker/corrected c=0",
        "sera/tracker/uncorrected c=0", "sera/true/corrected c=0",
        "sera/true/corrected/uncapped c=0"],
    1: ["uniform c=1", f"{DEMO_PEER}/tracker/corrected c=1", "sera/tracker/corrected c=1",
        "sera/true/corrected/uncapped c=1"],
}


LEGEND = """\
uniform          equal rollouts per prompt (MaxRL as published; the planner's default)
SERA(tracker)    SERA on posterior means from a few rollouts per prompt of an earlier round
SERA(true p)     SERA on the exact success probabilities
uncorr.          without the multiplicity correction (token-mean weights prompts by n_i)
no cap           no maximum count (max_ratio=None); otherwise n_i <= {ratio} x budget/prompt
With c=1 every policy needs 2 rollouts per prompt, so at 2 rollouts/prompt all coincide."""


DEMO_LEGEND = """\
{peer}: alpha-fair with {options} (RolloutPlanner("sera-fair", alpha=1.0)), on the same
posterior means; between SERA (alpha = inf) and the plain sum (alpha = 0). The planner's
default is uniform allocation (docs/benchmarks.md, "A default chosen on cost")."""


def verdict(payload: dict, extra: tuple[str, ...] = ()) -> list[str]:
    """One line per offset: at how many budgets each SERA variant (and each method ``extra``
    names, e.g. ``"sera-fair:alpha=1/tracker/corrected"``) beats uniform (expected cosine)."""
    lines = []
    for c in payload["config"]["offsets"]:
        uniform = {e["budget_per_prompt"]: e["expected_cosine"] for e in payload["results"]
                   if e["method"] == f"uniform c={c}"}
        parts = []
        for key in (*(f"{k} c={c}" for k in extra), f"sera/tracker/corrected c={c}",
                    f"sera/true/corrected c={c}", f"sera/true/corrected/uncapped c={c}"):
            rows = [e for e in payload["results"] if e["method"] == key]
            if not rows:
                continue
            better = sum(e["expected_cosine"] > uniform[e["budget_per_prompt"]] + 1e-12
                         for e in rows)
            worse = sum(e["expected_cosine"] < uniform[e["budget_per_prompt"]] - 1e-12
                        for e in rows)
            parts.append(f"{short_label(key)} above uniform at {better}/{len(rows)} budgets, "
                         f"below at {worse}")
        lines.append(f"c={c}: " + "; ".join(parts) + ".")
    return lines


def _describe(payload: dict) -> str:
    sp = payload["success_probs"]
    cfg = payload["config"]
    return (
        f"{cfg['num_batches']} batches of {cfg['batch_size']} digits prompts; "
        f"mean p {sp['mean']:.2f}, {sp['fraction_below_0.01']:.0%} of prompts below 0.01, "
        f"{sp['fraction_above_0.95']:.0%} above 0.95.\n"
        f"Tracker: posterior means after {cfg['history_rollouts']} rollouts per prompt from "
        f"an earlier checkpoint (mean |estimate - p| = {sp['tracker_mean_abs_error']:.2f})."
    )


def _column_groups(payload: dict, c: int) -> list[list[str]]:
    """Tables of at most a handful of columns: SERA variants, peers corrected, peers not."""
    keys = list(dict.fromkeys(e["method"] for e in payload["results"] if e["offset"] == c))
    uniform = f"uniform c={c}"
    sera = [k for k in keys if k.startswith("sera/")]
    peers = [k for k in keys if k not in sera and k != uniform]
    groups = [sera[:4], sera[4:],
              [k for k in peers if "/corrected" in k],
              [k for k in peers if "/uncorrected" in k]]
    return [[uniform] + g for g in groups if g]


def print_report(payload: dict, *, sampled: bool, columns: dict[int, list[str]] | None = None):
    print(_describe(payload))
    for c in payload["config"]["offsets"]:
        groups = ([columns[c]] if columns is not None and c in columns
                  else _column_groups(payload, c))
        print()
        print(f"Cosine similarity with the exact likelihood gradient, {ESTIMATORS[c]} "
              f"estimator (c={c}); cell: expected estimator"
              + (f" (sampled: mean±sd over {payload['config']['draws']} draws x "
                 f"{payload['config']['num_batches']} batches)" if sampled else ""))
        for keys in groups:
            print(format_table(payload, keys, sampled=sampled))
            print()


def print_paired(payload: dict) -> None:
    """Per offset and estimator: each corrected tracker-fed method's cosine minus uniform's on
    the same batches, mean [95 % interval], one row per budget."""
    batches = payload["config"]["num_batches"]
    for c in payload["config"]["offsets"]:
        keys = [k for k in dict.fromkeys(e["method"] for e in payload["results"]
                                         if e["offset"] == c)
                if "/tracker/corrected" in k and "/uncapped" not in k]
        for metric, what in (("expected_cosine", "expected"), ("sampled_cosine", "sampled")):
            field = f"{metric}_vs_uniform"
            if not any(field in e for e in payload["results"]):
                continue
            print(f"\n{what.capitalize()} estimator's cosine minus uniform's on the same batch, "
                  f"{ESTIMATORS[c]} (c={c}): mean [95 % interval, paired t over {batches} "
                  "batches]" + (" (sampled: the mean over each batch's draws)"
                                if what == "sampled" else ""))
            for group in [keys[i:i + 4] for i in range(0, len(keys), 4)]:
                header = ["rollouts/prompt"] + [short_label(k) for k in group]
                body = []
                for nbar in payload["config"]["budgets"]:
                    cells = [str(nbar)]
                    for key in group:
                        entry = _lookup(payload, key, nbar)
                        d = entry.get(field) if entry else None
                        cells.append("-" if d is None else _harness.format_interval(
                            d["mean"], d["ci_low"], d["ci_high"]))
                    body.append(cells)
                widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
                for r in [header] + body:
                    print("  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)))
    if batches < 2:
        print("note: one batch: the intervals are undefined (shown as 'no interval').")
