"""The warm start's half of the regime check at several stopping levels (a preset's pilot).

``python -m sera_opt.benchmarks.arithmetic.pilot --preset expand --seed 1000 --levels
0.12,0.15,0.2,0.25`` warm-starts the preset's model once per level, from the same seed, and
prints where it stopped and the training prompts' sampled success rates against the regime
check (docs/decisions/2026-12-07-coverage-expansion-rule.md); nothing is trained beyond the
warm start.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from sera_opt.benchmarks import _coverage, _harness
from sera_opt.benchmarks.arithmetic.train import (
    PRESETS,
    _device_generator,
    _torch,
    build_model,
    count_correct,
    warm_start,
)


def _levels(text: str) -> tuple[float, ...]:
    try:
        values = tuple(_harness.fraction(v) for v in text.split(","))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"levels are numbers in (0, 1] separated by commas: "
                                         f"{exc}") from None
    return values


def scan(preset: str, seed: int, levels) -> list[dict]:
    """One row per level: the warm start's stopping step, its last probe, and the regime
    check's warm-start half on ``eval_samples`` samples of every training prompt."""
    from sera_opt.benchmarks.arithmetic.task import make_split

    torch = _torch()
    torch.set_num_threads(1)
    rows = []
    for level in levels:
        cfg = replace(PRESETS[preset], sft_target_success=float(level))
        train, test = make_split(cfg.data_seed, cfg.num_train, cfg.num_test, cfg.max_digits)
        torch.manual_seed(seed)
        model, tokenizer = build_model(cfg, "cpu")
        sft = warm_start(model, tokenizer, cfg, train, test, seed, "cpu", show_progress=False)
        # The same stream as run_seed's training-pool rates: the numbers the runs will print.
        gen = _device_generator("cpu", seed * 1000 + 43)
        correct = count_correct(model, tokenizer, train, cfg.eval_samples, gen, cfg, "cpu")
        probes = sft["probes"]["mean_success"]
        rows.append({"level": float(level), "steps": sft["steps"],
                     "probe": probes[-1] if probes else float("nan"),
                     **_coverage.warm_start_regime(correct / cfg.eval_samples)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sera_opt.benchmarks.arithmetic.pilot",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="expand")
    parser.add_argument("--seed", type=_harness.seed, default=1000)
    parser.add_argument("--levels", type=_levels, default=(0.12, 0.15, 0.2, 0.25))
    args = parser.parse_args(argv)
    for row in scan(args.preset, args.seed, args.levels):
        print(f"level {row['level']:g}: stopped at step {row['steps']} at sampled success "
              f"{row['probe']:.3f}; " + _coverage.format_regime(warm=row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
