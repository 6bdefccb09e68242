"""The command lines: ``sera-opt bench alignment`` and ``sera-opt demo``."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sera_opt.benchmarks import _harness

from .config import (
    DEMO_OPTIONS,
    DEMO_PEER,
    FULL,
    NAME,
    PEERS,
    QUICK,
    REPORT_PEERS,
    AlignmentConfig,
    check_peers,
)
from .report import (
    DEMO_COLUMNS,
    DEMO_LEGEND,
    LEGEND,
    plot,
    print_paired,
    print_report,
    short_label,
    verdict,
)
from .runner import run
from .summary import demo_plot, demo_verdict


def _parser(prog: str, description: str, *, for_demo: bool = False) -> argparse.ArgumentParser:
    if for_demo:
        # The demo is always the quick preset and writes nothing unless asked.
        parser = argparse.ArgumentParser(prog=prog, description=description)
        parser.add_argument("--out", type=Path, default=None,
                            help="also write the results as demo.json into this folder")
        parser.add_argument("--seed", type=_harness.seed, default=0,
                            help="random seed (default: 0)")
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    else:
        parser = _harness.common_parser(NAME, description)
        parser.prog = prog
    parser.add_argument("--budgets", type=_harness.at_least(1), nargs="+",
                        help="average rollouts per prompt (default: 2 4 8 16 32 64)")
    parser.add_argument("--draws", type=_harness.at_least(1),
                        help="sampled draws per batch and method")
    parser.add_argument("--batches", type=_harness.at_least(1), help="number of prompt batches")
    parser.add_argument("--batch-size", type=_harness.at_least(1),
                        help="prompts per batch (default: 256)")
    parser.add_argument("--history-rollouts", type=_harness.at_least(0),
                        help="rollouts per prompt in the earlier round that feeds the tracker")
    parser.add_argument("--max-ratio", type=_harness.at_least(1),
                        help="max_rollouts = this * budget per prompt (default: 4)")
    parser.add_argument("--peers", nargs="*",
                        help="peer policies to compare, each a name or "
                             "name:key=value[:key=value...] (default: "
                             f"{' '.join(PEERS)}"
                             + ("; the demo compares none unless asked)" if for_demo else
                                f"; the report run uses {' '.join(REPORT_PEERS)})"))
    parser.add_argument("--expected-only", action="store_true",
                        help="skip the sampled estimators (no torch estimator needed)")
    return parser


def _config_from(args, base: AlignmentConfig) -> AlignmentConfig:
    updates: dict[str, Any] = {"seed": args.seed}
    for arg, name in (("budgets", "budgets"), ("draws", "draws"), ("batches", "num_batches"),
                      ("batch_size", "batch_size"), ("history_rollouts", "history_rollouts"),
                      ("max_ratio", "max_ratio"), ("peers", "peers")):
        value = getattr(args, arg)
        if value is not None:
            updates[name] = tuple(value) if isinstance(value, list) else value
    return replace(base, **updates)


def main(argv=None) -> int:
    """``sera-opt bench alignment``: write alignment.json and alignment.png to ``--out``."""
    parser = _parser("sera-opt bench alignment",
                     "Alignment of MaxRL gradient estimates with the exact likelihood gradient "
                     "on a digits classifier, for uniform, SERA and peer allocations.")
    args = parser.parse_args(argv)
    config = _config_from(args, QUICK if args.quick else FULL)
    check_peers(config)
    payload = run(config, show_progress=not args.no_progress, sampled=not args.expected_only)
    payload["command"] = "sera-opt bench alignment " + " ".join(
        sys.argv[1:] if argv is None else list(argv))
    print_report(payload, sampled=not args.expected_only)
    print_paired(payload)
    print("\nExpected-estimator cosine versus uniform:")
    for line in verdict(payload):
        print("  " + line)
    json_path = _harness.write_json(args.out, NAME, payload)
    fig_path = _harness.save_figure(plot(payload), args.out, NAME)
    print(f"\nwrote {json_path} and {fig_path} ({payload['timings']['total_s']:.1f} s)")
    return 0


def demo(argv=None) -> int:
    """``sera-opt demo``: the quick alignment comparison, printed as a table."""
    parser = _parser("sera-opt demo",
                     "Quick comparison of SERA and uniform MaxRL: how well the gradient "
                     "estimate aligns with the exact likelihood gradient of a digits classifier.",
                     for_demo=True)
    args = parser.parse_args(argv)
    config = _config_from(args, QUICK)
    chosen = args.peers is not None
    if not chosen:
        config = replace(config, peers=(DEMO_PEER,))  # sera-fair at alpha 1 beside SERA
    check_peers(config)
    start = time.perf_counter()
    payload = run(config, show_progress=not args.no_progress, sampled=not args.expected_only)
    print("sera-opt demo: how well the MaxRL batch gradient aligns with the exact likelihood")
    print("gradient of a digits classifier (1.0 = same direction).")
    print_report(payload, sampled=not args.expected_only,
                  columns=None if chosen else DEMO_COLUMNS)
    print()
    print(LEGEND.format(ratio=config.max_ratio))
    if not chosen:
        print(DEMO_LEGEND.format(peer=short_label(f"{DEMO_PEER}/tracker"), options=", ".join(
            f"{k} = {v:g}" for k, v in DEMO_OPTIONS.items())))
    print()
    print("Expected-estimator cosine versus uniform:")
    for line in verdict(payload, () if chosen else (f"{DEMO_PEER}/tracker/corrected",)):
        print("  " + line)
    peer = None if chosen else DEMO_PEER
    written = ""
    if args.out is not None:
        json_path = _harness.write_json(args.out, "demo", payload)
        png_path = _harness.save_figure(demo_plot(payload, peer), args.out, "demo")
        written = f" Wrote {json_path} and {png_path}."
    t = payload["timings"]
    print(f"({time.perf_counter() - start:.1f} s: training {t['train_s']:.1f} s, first allocation "
          f"(numba compile or cache load) {t['first_allocate_s']:.1f} s. Full run with the peers: "
          f"sera-opt bench alignment.{written})")
    print()
    print(demo_verdict(payload, peer))
    return 0
