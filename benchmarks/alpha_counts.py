"""How the counts move with alpha on one batch: the picture in docs/policies.md.

One batch of 24 prompts whose success probabilities span hopeless to solved
(posterior-mean-like estimates: the hardest is 1/(n + 2) after a few failures),
4 rollouts per prompt, bounds 2..32, the mean-centred estimator (c = 1). For
each alpha of the family (docs/theory.md section 8) the exact counts of
``sera-fair``, with ``sera`` (alpha = inf) and uniform beside them.

Run ``python -m sera_opt.benchmarks.alpha_counts --out docs/img``; it writes
``alpha_counts.json`` and ``alpha_counts.png``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

import sera_opt

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _harness  # type: ignore[no-redef]
else:
    from sera_opt.benchmarks import _harness

ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0, math.inf)
NAME = "alpha_counts"


def batch() -> np.ndarray:
    """The batch's success probabilities, sorted from hardest to easiest."""
    hopeless = [1 / 50, 1 / 34, 1 / 22, 1 / 12]  # posterior means after 48, 32, 20, 10 failures
    spread = np.geomspace(0.12, 0.8, 14).tolist()
    solved = [0.9, 0.95, 0.97, 0.98, 0.99, 0.995]
    return np.array(hopeless + spread + solved)


def counts_by_alpha(p: np.ndarray, *, per_prompt: int = 4, lo: int = 2, hi: int = 32):
    budget = per_prompt * p.size
    rows = {}
    for alpha in ALPHAS:
        policy = sera_opt.get_policy("sera-fair", alpha=alpha, offset=1, min_rollouts=lo,
                                     max_rollouts=hi)
        rows["inf" if math.isinf(alpha) else f"{alpha:g}"] = policy.allocate(p, budget)
    uniform = sera_opt.get_policy("uniform", offset=1, min_rollouts=lo, max_rollouts=hi)
    rows["uniform"] = uniform.allocate(p, budget)
    return budget, rows


def plot(p, rows, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.5, 3.6))
    x = np.arange(p.size)
    colors = plt.cm.viridis(np.linspace(0.0, 0.9, len(ALPHAS)))
    for (label, alloc), color in zip(((k, v) for k, v in rows.items() if k != "uniform"),
                                     colors):
        name = "alpha = inf (sera)" if label == "inf" else f"alpha = {label}"
        ax.plot(x, alloc.counts, marker="o", ms=3, color=color, label=name)
        bx.plot(x, alloc.factors, marker="o", ms=3, color=color)
    ax.plot(x, rows["uniform"].counts, color="0.5", ls="--", label="uniform")
    bx.plot(x, rows["uniform"].factors, color="0.5", ls="--")
    for axis in (ax, bx):
        axis.set_xticks(x[::3])
        axis.set_xticklabels([f"{v:.2f}" for v in p[::3]])
        axis.set_xlabel("prompt's estimated success probability")
    ax.set_ylabel("rollouts")
    ax.set_title("counts, 4 per prompt on average (bounds 2..32)")
    bx.set_ylabel("attenuation factor w_1(p, n)")
    bx.set_title("the factors they give")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _harness.save_figure(fig, out_dir, NAME)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sera_opt.benchmarks.alpha_counts",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=_harness.DEFAULT_OUT)
    args = parser.parse_args(argv)
    p = batch()
    budget, rows = counts_by_alpha(p)
    payload = {"success_probs": p.tolist(), "budget": budget,
               "counts": {k: v.counts.tolist() for k, v in rows.items()},
               "min_factor": {k: v.min_factor for k, v in rows.items()},
               "sum_of_factors": {k: float(v.factors.sum()) for k, v in rows.items()}}
    _harness.write_json(args.out, NAME, payload)
    plot(p, rows, args.out)
    for key, alloc in rows.items():
        print(f"{key:>8}: {' '.join(f'{n:2d}' for n in alloc.counts)}  "
              f"min w {alloc.min_factor:.3f}  sum w {alloc.factors.sum():.2f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
