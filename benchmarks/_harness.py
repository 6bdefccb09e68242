"""Shared pieces of the benchmarks: options, timing, progress, results and plots.

Every benchmark exposes ``main(argv=None) -> int`` and is run as ``sera-opt
bench NAME`` or ``python -m sera_opt.benchmarks.NAME``. The speed benchmarks
are flat modules beside this one (``solvers``, ``estimator``, ``tracking``);
each experiment is a subpackage (``alignment``, ``maze``, ``arithmetic``) with
its task, model, training and runner. Results go to ``--out`` as
``NAME.json`` (machine-readable, with the machine's description) and
``NAME.png``.

The experiments share two more pieces here: the arm specifications of their
command lines (``name`` or ``name:key=value[:key=value...]``, see
:func:`parse_arms`) and the statistics of their paired comparisons
(:func:`paired_difference`, :func:`mean_interval`).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sera_opt.cache import BACKGROUND_COMPILE_ENV as BACKGROUND_ENV
from sera_opt.exceptions import SeraOptError, SeraOptWarning

__all__ = [
    "common_parser",
    "seed",
    "at_least",
    "fraction",
    "positive",
    "machine_info",
    "median_time",
    "progress",
    "write_json",
    "save_figure",
    "pass_at_k",
    "pass_at_k_curve",
    "run_command",
    "ArmSpec",
    "ArmSpecError",
    "RESERVED_OPTIONS",
    "REPORT_ARMS",
    "arm_policy_name",
    "parse_arm",
    "parse_arms",
    "check_arms",
    "arm_colors",
    "INTERVAL_KS",
    "paired_difference",
    "paired_difference_at",
    "mean_interval",
    "median_interval",
    "format_interval",
    "paired_table",
    "plot_paired",
    "CostGrid",
    "at_cost",
    "common_amounts",
    "equal_cost_summary",
    "equal_cost_table",
]

DEFAULT_OUT = Path("benchmark-results")
#: The arms of the training experiments' report runs, which decided the library's
#: default allocation (docs/benchmarks.md, "The decision"); the default arms of
#: ``sera-opt bench maze`` and ``sera-opt bench arithmetic``.
REPORT_ARMS = ("uniform", "sera", "hora", "sera-fair:alpha=0", "sera-fair:alpha=1",
               "sera-fair:alpha=2")


def common_parser(name: str, description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares.

    ``--quick`` selects a small preset, ``--out`` the results folder, ``--seed``
    the random seed and ``--no-progress`` silences progress bars.
    """
    parser = argparse.ArgumentParser(prog=f"sera-opt bench {name}", description=description)
    parser.add_argument("--quick", action="store_true",
                        help="small preset that finishes in about a minute")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for the JSON results and plots (default: {DEFAULT_OUT})")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (default: 0)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


#: The seeds every random source of the benchmarks takes (numpy's legacy generator,
#: scikit-learn's random_state): 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1


def seed(text: str) -> int:
    """An argparse type: a random seed, a whole number from 0 to :data:`MAX_SEED`
    (checked before any work, not when the first generator is made)."""
    value = _whole(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"a seed is a whole number from 0 to {MAX_SEED}, "
                                         f"got {value}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` (a count of rounds,
    repeats, steps or prompts), refused on the command line, before any work."""
    def parse(text: str) -> int:
        value = _whole(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, "
                                             f"got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"  # argparse names the type in errors
    return parse


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (a decay factor)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (a time limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # not a number, or beyond Python's 4,300-digit limit
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number") from None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for module in ("numba", "torch", "cvxpy", "scipy"):
        mod = sys.modules.get(module)
        if mod is not None:
            info[module] = getattr(mod, "__version__", "?")
    return info


def median_time(func: Callable[[], Any], *, repeats: int = 7, min_time: float = 0.0,
                warmup: int = 1, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, float]:
    """Median, min and max time of ``func()`` over ``repeats`` calls.

    ``warmup`` calls run first and are not counted (JIT compilation, caches).
    Each repeat loops ``func`` enough times to last ``min_time`` seconds, so that
    microsecond calls are not dominated by timer resolution. ``clock`` is wall
    time by default; ``time.process_time`` (CPU time of this process) is the
    steadier choice for single-threaded code on a machine shared with other work.
    """
    for _ in range(warmup):
        func()
    loops = 1
    if min_time > 0:
        start = clock()
        func()
        once = max(clock() - start, 1e-9)
        loops = max(1, int(min_time / once))
    times = []
    for _ in range(repeats):
        start = clock()
        for _ in range(loops):
            func()
        times.append((clock() - start) / loops)
    arr = np.asarray(times)
    return {"median": float(np.median(arr)), "min": float(arr.min()), "max": float(arr.max()),
            "repeats": repeats, "loops": loops}


def progress(iterable: Iterable, *, desc: str, total: int | None = None,
             enabled: bool = True) -> Iterable:
    """Wrap ``iterable`` in a tqdm bar on stderr when tqdm is installed and enabled."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def write_json(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus the machine description to ``out_dir/name.json``, whole or
    not at all (a run stopped while it writes leaves the previous file, never a truncated
    one that a decision tool would have to refuse)."""
    from sera_opt.checked_state import write_atomic

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    body = {"benchmark": name, "machine": machine_info(), **payload}
    data = (json.dumps(_jsonable(body), indent=2) + "\n").encode("utf-8")
    write_atomic(path, lambda f: f.write(data))
    return path


def save_figure(fig, out_dir: Path, name: str) -> Path:
    """Save a matplotlib figure as ``out_dir/name.png`` and close it."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def pass_at_k(num_samples, num_correct, k) -> np.ndarray:
    """Unbiased pass@k from ``num_samples`` draws of which ``num_correct`` succeeded.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021), computed as a running
    product so that it stays exact in floating point for large ``n``. Arrays
    broadcast; ``k`` must not exceed ``num_samples``.
    """
    n = np.asarray(num_samples, dtype=np.int64)
    c = np.asarray(num_correct, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    n, c, k = np.broadcast_arrays(n, c, k)
    if (k > n).any() or (k < 1).any():
        raise ValueError("pass@k needs 1 <= k <= num_samples.")
    if (c < 0).any() or (c > n).any():
        raise ValueError("num_correct must lie in [0, num_samples].")
    out = np.empty(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci, ki = int(n[idx]), int(c[idx]), int(k[idx])
        if ni - ci < ki:
            out[idx] = 1.0
        else:
            # prod_{j = n-c+1}^{n} (1 - k / j) = C(n-c, k) / C(n, k)
            j = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
            out[idx] = 1.0 - float(np.prod(1.0 - ki / j))
    return out


def pass_at_k_curve(successes, num_samples: int, k_max: int) -> np.ndarray:
    """Mean over prompts of the unbiased pass@k for k = 1..k_max.

    ``successes[i]`` is how many of ``num_samples`` draws of prompt ``i`` succeeded.
    """
    ks = np.arange(1, k_max + 1)
    table = pass_at_k(num_samples, np.asarray(successes)[:, None], ks[None, :])
    return table.mean(axis=0)


def run_command(name: str, main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a benchmark's ``main`` as a command: a :class:`~sera_opt.SeraOptError` becomes one
    line on stderr and exit status 2, as under ``sera-opt bench NAME``; every kernel is
    compiled in this process on first use (``SERA_OPT_BACKGROUND_COMPILE=0``), as under
    ``sera-opt bench``, so that what is timed is the kernel a warm cache gives."""
    os.environ[BACKGROUND_ENV] = "0"
    try:
        return int(main(sys.argv[1:] if argv is None else argv) or 0)
    except SeraOptError as exc:
        print(f"sera-opt bench {name}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- arm specifications


class ArmSpecError(SeraOptError):
    """An arm specification of an experiment's command line is malformed or names a policy
    or option that does not exist."""


#: Options an experiment sets for every arm alike; an arm cannot override them.
RESERVED_OPTIONS = frozenset({"min_rollouts", "max_rollouts", "offset"})
#: Options every arm takes beside its policy's: the step in rounds
#: (:meth:`sera_opt.RolloutPlanner.start_rounds`).
ROUND_OPTIONS = frozenset({"rounds", "first"})
#: The peer whose rounds are its own rule, not an allocation policy
#: (:class:`sera_opt.rounds.ReinforceAda`), and the options its arm takes: the rule's,
#: and ``matched=True`` for the variant capped at the experiment's budget.
REINFORCE_ADA = "reinforce-ada"
REINFORCE_ADA_OPTIONS = frozenset({"exit", "per_round", "max_rounds", "keep", "matched"})


@dataclass(frozen=True)
class ArmSpec:
    """One arm of an experiment: a registered policy and its options.

    Attributes
    ----------
    label : str
        The specification as written (``"sera-fair:alpha=1"``); the arm's name in
        the results, tables and plots.
    policy : str
        The registered policy name (``"sera-fair"``).
    options : tuple of (str, value) pairs
        The options given after the name, in order.
    """

    label: str
    policy: str
    options: tuple[tuple[str, Any], ...] = ()
    #: Rounds per step (``:rounds=R``; 1 is a static plan) and the first round's
    #: rollouts per prompt (``:first=n0``; None: the session's default).
    rounds: int = 1
    first: int | None = None

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def is_reinforce_ada(self) -> bool:
        """Whether the arm is the Reinforce-Ada peer (its own rounds, estimator and budget)."""
        return self.policy == REINFORCE_ADA

    def build_rule(self, *, num_prompts: int, budget: int):
        """The Reinforce-Ada rule of this arm and its step cap: ``(rule, None)`` for the
        paper's own schedule and budget (rounds of 8, at most 4, up to 32 rollouts per
        prompt), ``(rule, budget)`` for ``matched=True``: the same schedule shrunk to fit
        the experiment's budget, rounds of ``max(1, budget // (num_prompts * max_rounds))``
        rollouts per active prompt (unless ``per_round`` is given), never more than
        ``budget`` in a step."""
        from sera_opt.rounds import ReinforceAda

        if not self.is_reinforce_ada:
            raise ArmSpecError(f"arm {self.label!r} is an allocation policy; use build().")
        options = self.kwargs
        matched = options.pop("matched", False)
        if not isinstance(matched, bool):
            raise ArmSpecError(f"arm {self.label!r}: matched is True or False, got {matched!r}.")
        if matched and "per_round" not in options:
            rounds = options.get("max_rounds", 4)
            if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1:
                options["per_round"] = max(1, budget // (num_prompts * rounds))
        try:
            rule = ReinforceAda(**options)
        except (SeraOptError, TypeError, ValueError) as exc:
            raise ArmSpecError(f"arm {self.label!r}: {_one_line(exc)}") from None
        return rule, (budget if matched else None)

    def start_rounds(self, planner, prompt_ids, budget: int):
        """``planner.start_rounds`` with this arm's rounds and first-round size."""
        return planner.start_rounds(prompt_ids, budget, rounds=self.rounds,
                                    first_round=self.first)

    def build(self, *, min_rollouts, max_rollouts, offset: int):
        """``sera_opt.get_policy(policy, **options)`` with the experiment's bounds and offset.

        A ``max_ratio`` option is refused when the experiment gives a cap: the
        policy would never use it (it only sets the cap when none is given).
        """
        import sera_opt

        if self.is_reinforce_ada:
            raise ArmSpecError(
                f"arm {self.label!r} is Reinforce-Ada's round rule, not an allocation policy; "
                "use build_rule().")
        options = self.kwargs
        if "max_ratio" in options and max_rollouts is not None:
            raise ArmSpecError(
                f"arm {self.label!r}: max_ratio has no effect here, because this experiment caps "
                f"every arm at max_rollouts={max_rollouts}; change the common cap instead.")
        try:
            with warnings.catch_warnings():
                # An option the policy or its solver would ignore is an error in an arm.
                warnings.simplefilter("error", SeraOptWarning)
                return sera_opt.get_policy(self.policy, **options, min_rollouts=min_rollouts,
                                           max_rollouts=max_rollouts, offset=offset)
        except (SeraOptError, SeraOptWarning, TypeError, ValueError) as exc:
            raise ArmSpecError(f"arm {self.label!r}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _split_top_level(text: str, separator: str) -> list[str]:
    """Split ``text`` at ``separator`` outside quotes and brackets (so that a value may be
    a tuple or a quoted string holding the separator)."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                break
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if quote or depth:
        raise ArmSpecError(f"unbalanced quotes or brackets in {text!r}.")
    parts.append(text[start:])
    return parts


_INFINITIES = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


def _parse_value(text: str, key: str, spec: str) -> Any:
    if text in _INFINITIES:
        return _INFINITIES[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ArmSpecError(
            f"arm {spec!r}: the value {text!r} of option {key!r} is not a Python literal (a "
            f"number, inf, None, True, False, or a quoted string such as {key}='{text}')."
        ) from None


def arm_policy_name(text: str) -> str:
    """The policy name of an arm specification: what comes before its first ``:``."""
    return _split_top_level(str(text).strip(), ":")[0].strip()


def parse_arm(text: str, *, available: Iterable[str] | None = None) -> ArmSpec:
    """Parse ``name`` or ``name:key=value[:key=value...]`` into an :class:`ArmSpec`.

    Values are Python literals (``2``, ``0.5``, ``1e-3``, ``None``, ``True``,
    ``'milp'``) or ``inf`` / ``-inf``. The name must be a registered policy and
    a key may appear once; the bounds and the offset belong to the experiment
    (:data:`RESERVED_OPTIONS`). Raises :class:`ArmSpecError` with a one-line
    message otherwise. Whether the policy takes the options is checked when it
    is built (:meth:`ArmSpec.build`, :func:`check_arms`). ``available`` replaces
    the registry's names as the known policies (for tests of the callers).
    """
    import sera_opt

    known = tuple(sera_opt.available_policies() if available is None else available)
    known += (REINFORCE_ADA,)
    if not isinstance(text, str):
        raise ArmSpecError(f"an arm is given as a string such as 'sera:max_ratio=2', got {text!r}.")
    label = text.strip()
    if not label:
        raise ArmSpecError("empty arm specification (two commas in a row, or a trailing comma?).")
    name, *items = [part.strip() for part in _split_top_level(label, ":")]
    if name not in known:
        raise ArmSpecError(
            f"arm {label!r}: unknown policy {name!r}; registered policies: {', '.join(known)}.")
    options: dict[str, Any] = {}
    rounds: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier() or not value:
            raise ArmSpecError(
                f"arm {label!r}: {item!r} is not of the form key=value "
                f"(write e.g. 'sera:max_ratio=2' or 'vip:gamma=0.001').")
        if key in options or key in rounds:
            raise ArmSpecError(f"arm {label!r}: option {key!r} is given twice.")
        if name == REINFORCE_ADA:
            if key not in REINFORCE_ADA_OPTIONS:
                raise ArmSpecError(
                    f"arm {label!r}: Reinforce-Ada takes {', '.join(sorted(REINFORCE_ADA_OPTIONS))}"
                    f" (its rounds are its own rule: per_round and max_rounds), not {key!r}.")
            options[key] = _parse_value(value, key, label)
            continue
        if key in ROUND_OPTIONS:
            rounds[key] = _round_option(key, value, label)
            continue
        if key in RESERVED_OPTIONS:
            raise ArmSpecError(
                f"arm {label!r}: {key} is set by the experiment for every arm alike "
                f"({', '.join(sorted(RESERVED_OPTIONS))}); it cannot differ between arms.")
        options[key] = _parse_value(value, key, label)
    if "first" in rounds and rounds.get("rounds", 1) == 1:
        raise ArmSpecError(
            f"arm {label!r}: first sets the first round of a step in rounds; add rounds=R "
            f"(R >= 2) or drop first.")
    return ArmSpec(label=label, policy=name, options=tuple(options.items()),
                   rounds=rounds.get("rounds", 1), first=rounds.get("first"))


def _round_option(key: str, value: str, label: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < 1 or str(number) != value:
        raise ArmSpecError(f"arm {label!r}: {key} must be a whole number >= 1, got {value!r}.")
    return number


def parse_arms(arms: str | Sequence[str | ArmSpec]) -> tuple[ArmSpec, ...]:
    """Parse a comma-separated list of arm specifications (or a sequence of them).

    Commas inside quotes or brackets do not separate arms. Two arms with the
    same label, or with the same policy and options, are refused.
    """
    if isinstance(arms, str):
        arms = _split_top_level(arms, ",")
    specs = tuple(a if isinstance(a, ArmSpec) else parse_arm(a) for a in arms)
    seen: dict[Any, str] = {}
    for spec in specs:
        # Options in any order, 1 and 1.0 alike: the same policy is the same arm.
        same = (spec.policy, spec.rounds, spec.first,
                tuple(sorted((k, repr(float(v)) if isinstance(v, (int, float))
                              else repr(v)) for k, v in spec.options)))
        for key in (spec.label, same):
            if key in seen:
                raise ArmSpecError(
                    f"arms {seen[key]!r} and {spec.label!r} are the same policy with the same "
                    f"options; give each arm once.")
            seen[key] = spec.label
    return specs


def check_arms(arms, *, min_rollouts, max_rollouts, offset: int, num_prompts: int,
               budget: int) -> tuple[ArmSpec, ...]:
    """Parse ``arms`` and prove that each builds and allocates with the experiment's settings.

    Each policy is built with the experiment's bounds and offset and run once on
    a small problem of ``num_prompts`` prompts (probabilities spread over (0, 1))
    and ``budget`` rollouts, with the library's warnings raised as errors, so an
    option that the policy or its solver would ignore is refused here, before
    any training starts, rather than warned about at every step.
    """
    specs = parse_arms(arms)
    success_probs = np.linspace(0.02, 0.98, num_prompts)
    for spec in specs:
        if spec.is_reinforce_ada:
            rule, cap = spec.build_rule(num_prompts=num_prompts, budget=budget)
            rule.start_rounds(budget=cap, num_prompts=num_prompts)
            continue
        policy = spec.build(min_rollouts=min_rollouts, max_rollouts=max_rollouts, offset=offset)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", SeraOptWarning)
                policy.allocate(success_probs, budget)
                if spec.rounds > 1:
                    policy.start_rounds(success_probs, budget, rounds=spec.rounds,
                                        first_round=spec.first)
        except (SeraOptError, SeraOptWarning, TypeError) as exc:
            raise ArmSpecError(f"arm {spec.label!r}: {_one_line(exc)}") from None
    return specs


#: The colour of each policy's bare name in every plot of the benchmarks (the one map
#: they all use); other arms get the next free ones.
POLICY_COLORS = {"uniform": "tab:blue", "sera": "tab:red", "knapsack": "tab:green",
                 "hora": "tab:orange", "vip": "tab:purple", "gvm": "tab:brown",
                 "sera-bayes": "tab:pink"}
# No greys: the experiments draw their warm-up or warm start in grey.
_SPARE_COLORS = ("tab:cyan", "tab:olive", "#393b79", "#637939", "#8c6d31", "#843c39",
                 "#7b4173", "#e6550d", "#31a354", "#3182bd", "#756bb1", "#9c9ede")


def arm_colors(labels: Iterable[str], fixed: dict[str, str] | None = None) -> dict[str, str]:
    """A distinct colour per arm label: ``fixed`` (default :data:`POLICY_COLORS`) for the
    labels it names, then colours that none of the fixed ones uses, in order."""
    fixed = POLICY_COLORS if fixed is None else fixed
    used = set(fixed.values())
    spare = iter([c for c in _SPARE_COLORS if c not in used])
    out = {}
    for label in labels:
        if label in fixed:
            out[label] = fixed[label]
        else:
            out[label] = next(spare, "0.3")
    return out


# --------------------------------------------------------------------------- equal cost


class CostGrid:
    """Evaluate a training run at fixed amounts of what it has spent, not only at fixed steps.

    ``grids`` maps a cost (``"cpu_s"``, ``"tokens"``, ``"calls"``) to increasing
    amounts. After every step the run calls :meth:`step_end` with the cumulative
    amounts spent so far; for each amount ``t`` crossed during that step, the
    weights the run had *before* the step (the last ones reached within ``t``) are
    evaluated with ``evaluate(state)``. ``snapshot()`` returns a copy of the
    current weights. A state that several grids need is evaluated once. The
    caller keeps the evaluations' time out of the run's CPU time.

    ``points[cost]`` lists ``{"at": t, "step": s, "spent": amount at step s,
    "value": evaluate(...)}`` for the amounts the run reached; an amount beyond
    the run's end is never evaluated (no run is credited with a cost it did not
    pay, nor with weights it did not reach).
    """

    def __init__(self, grids: dict[str, Sequence[float]], evaluate: Callable[[Any], Any],
                 snapshot: Callable[[], Any]):
        self.grids = {name: sorted(float(v) for v in values) for name, values in grids.items()}
        self.evaluate = evaluate
        self.snapshot = snapshot
        self.points: dict[str, list[dict[str, Any]]] = {name: [] for name in self.grids}
        self._previous = (0, {name: 0.0 for name in self.grids}, snapshot() if grids else None)

    def step_end(self, step: int, spent: dict[str, float]) -> None:
        """Record the end of optimizer step ``step`` with the cumulative ``spent`` amounts."""
        if not self.grids:
            return
        before_step, before, state = self._previous
        value = None
        for name, grid in self.grids.items():
            for t in grid:
                if before[name] <= t < spent[name]:
                    if value is None:
                        value = self.evaluate(state)
                    self.points[name].append({"at": t, "step": before_step,
                                              "spent": before[name], "value": value})
        self._previous = (step, {name: float(spent[name]) for name in self.grids},
                          self.snapshot())


def at_cost(points: list[dict[str, Any]], amount: float):
    """The value a :class:`CostGrid` recorded at ``amount``, or None where the run did not
    reach it."""
    for point in points:
        if point["at"] == amount:
            return point["value"]
    return None


def common_amounts(grid: Sequence[float], runs_points: Iterable[list[dict[str, Any]]]
                   ) -> list[float]:
    """The amounts of ``grid`` that every run reached (where every pair is complete)."""
    runs_points = list(runs_points)
    return [t for t in grid if all(at_cost(points, t) is not None for points in runs_points)]


def equal_cost_summary(grids: dict[str, Sequence[float]],
                       points_by_arm: dict[str, list[dict[str, list]]], *,
                       baseline: str = "uniform", ks: Iterable[int] = (1, 16, 64)
                       ) -> dict[str, Any]:
    """The arms at equal cost: for each cost, the amounts of its grid that every run reached,
    each arm's pass@k there (mean, min, max over seeds) and its paired difference to
    ``baseline`` (:func:`paired_difference_at` at ``ks``).

    ``points_by_arm[arm]`` lists, seed by seed in the same order for every arm, a run's
    :attr:`CostGrid.points` whose values are pass@k curves.
    """
    runs = [points for rows in points_by_arm.values() for points in rows]
    out: dict[str, Any] = {"baseline": baseline,
                           "method": "grid evaluation: each arm is evaluated on the weights it "
                                     "had reached within each amount"}
    for cost, grid in grids.items():
        amounts = common_amounts(grid, (points[cost] for points in runs))
        entry: dict[str, Any] = {"amounts": amounts, "pass_at_k": {}, "paired_at": {}}
        for arm, rows in points_by_arm.items():
            values = {t: np.asarray([at_cost(p[cost], t) for p in rows], dtype=np.float64)
                      for t in amounts}
            entry["pass_at_k"][arm] = {t: {"mean": v.mean(axis=0), "min": v.min(axis=0),
                                           "max": v.max(axis=0)} for t, v in values.items()}
            if arm != baseline and baseline in points_by_arm:
                base = {t: [at_cost(p[cost], t) for p in points_by_arm[baseline]]
                        for t in amounts}
                entry["paired_at"][arm] = {
                    t: paired_difference_at(paired_difference(values[t], base[t]), ks)
                    for t in amounts}
        out[cost] = entry
    return out


def equal_cost_table(summary: dict[str, Any], words: dict[str, str]) -> str:
    """The paired tables of :func:`equal_cost_summary` at each cost's last common amount;
    ``words[cost]`` names the cost (``"CPU seconds"``)."""
    lines = []
    for cost, name in words.items():
        entry = summary[cost]
        if not entry["amounts"]:
            lines += ["", f"no amount of the {name} grid was reached by every run: no comparison "
                          f"at equal {name}"]
            continue
        t = entry["amounts"][-1]
        lines += ["", f"at {t:g} {name} (the grid's last amount every run reached):",
                  paired_table({arm: cells[t] for arm, cells in entry["paired_at"].items()},
                               baseline=summary["baseline"])]
    return "\n".join(lines)


# --------------------------------------------------------------------------- paired statistics


#: The k of pass@k at which the experiments report the paired difference to uniform.
INTERVAL_KS = (1, 16, 64)


def _t_interval(values: np.ndarray, confidence: float, unit: str = "seed") -> dict[str, Any]:
    """Mean, sample sd, t interval and t test of the mean against 0, along axis 0, over the
    finite entries of each column."""
    from scipy import stats

    if not 0 < confidence < 1:
        raise SeraOptError(f"confidence must lie in (0, 1), got {confidence!r}.")
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise SeraOptError("an interval needs at least one observation (one row per seed).")
    valid = np.isfinite(values)
    n = valid.sum(axis=0)
    filled = np.where(valid, values, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n > 0, filled.sum(axis=0) / n, np.nan)
        squares = np.where(valid, (values - mean) ** 2, 0.0).sum(axis=0)
        std = np.where(n > 1, np.sqrt(squares / (n - 1)), np.nan)
        df = np.where(n > 1, n - 1, np.nan)
        half = stats.t.ppf(0.5 + confidence / 2, df) * std / np.sqrt(n)
        # scipy.stats.ttest_rel's statistic: +-inf when every difference is the same
        # non-zero number, NaN when they are all zero.
        statistic = mean / (std / np.sqrt(n))
    p_value = 2.0 * stats.t.sf(np.abs(statistic), df)
    note = None
    if np.any(n < 2):
        note = (f"fewer than two {unit}s (or finite values): the interval and the p-value "
                "are undefined (NaN)")
    scalar = values.ndim == 1
    pick = (lambda a: a.item()) if scalar else (lambda a: a)
    return {"n": pick(n), "mean": pick(mean), "std": pick(std), "ci_low": pick(mean - half),
            "ci_high": pick(mean + half), "statistic": pick(statistic),
            "p_value": pick(p_value), "confidence": confidence, "note": note}


def paired_difference(candidate, baseline, *, confidence: float = 0.95,
                      unit: str = "seed") -> dict[str, Any]:
    """The paired comparison of ``candidate`` with ``baseline`` over seeds (or another
    ``unit`` of pairing, such as the alignment benchmark's batches).

    Parameters
    ----------
    candidate, baseline : array_like, shape (seeds,) or (seeds, K)
        One row per seed, the same seed in the same row (e.g. pass@k for
        k = 1..K).

    Returns
    -------
    dict
        Per column: ``mean`` of the per-seed differences ``candidate - baseline``,
        its ``confidence`` interval ``[ci_low, ci_high]`` from a paired t over
        seeds (Student's t with ``n - 1`` degrees of freedom), the two-sided
        ``p_value`` of the paired t test (``scipy.stats.ttest_rel``), the sample
        ``std`` of the differences, and the numbers of seeds ``ahead``
        (difference > 0), ``behind`` (< 0) and ``tied`` (= 0). With one seed the
        interval, ``std`` and ``p_value`` are NaN and ``note`` says why; when
        every seed's difference is the same number the interval has width 0
        (that is what the data say, not a default). NaN entries (an empty group)
        are left out of their column.
    """
    candidate = np.asarray(candidate, dtype=np.float64)
    baseline = np.asarray(baseline, dtype=np.float64)
    if candidate.shape != baseline.shape:
        raise SeraOptError(
            f"paired rows need equal shapes; got {candidate.shape} and {baseline.shape}.")
    diff = candidate - baseline
    out = _t_interval(diff, confidence, unit)
    finite = np.isfinite(diff)
    scalar = diff.ndim == 1
    for key, mask in (("ahead", diff > 0), ("behind", diff < 0), ("tied", diff == 0)):
        count = (mask & finite).sum(axis=0)
        out[key] = count.item() if scalar else count
    out["test"] = f"paired t over {unit}s, two-sided"
    return out


def paired_difference_at(paired: dict[str, Any], ks: Iterable[int]) -> dict[str, dict[str, Any]]:
    """``{"pass@k": {...}}``: the columns ``k - 1`` of a :func:`paired_difference` of pass@k
    curves, as scalars; a k beyond the curve is left out."""
    out = {}
    width = np.shape(paired["mean"])[0]
    for k in ks:
        if 1 <= k <= width:
            row = {key: (value[k - 1].item() if isinstance(value, np.ndarray) else value)
                   for key, value in paired.items()}
            if row["n"] >= 2:
                row["note"] = None
            out[f"pass@{k}"] = row
    return out


def mean_interval(values, *, confidence: float = 0.95, unit: str = "seed") -> dict[str, Any]:
    """Mean of ``values`` along axis 0 with its ``confidence`` t interval (``n - 1`` degrees
    of freedom, one value per ``unit``); NaN interval and a ``note`` with fewer than two."""
    out = _t_interval(values, confidence, unit)
    for key in ("statistic", "p_value"):
        out.pop(key)
    return out


def median_interval(values, *, confidence: float = 0.95) -> dict[str, Any]:
    """Median of ``values`` with a distribution-free ``confidence`` interval for it.

    The interval runs from the k-th smallest to the k-th largest value, with k
    the largest order for which ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``:
    its coverage is at least ``confidence`` for independent draws of any
    continuous distribution (no normality assumed, unlike a t interval). With
    too few values for any such pair (fewer than 6 at 95 %) the interval is NaN
    and ``note`` says so.
    """
    from scipy.stats import binom

    x = np.sort(np.asarray(values, dtype=float).ravel())
    n = x.size
    if n == 0:
        raise SeraOptError("a median interval needs at least one value.")
    if not 0 < confidence < 1:
        raise SeraOptError(f"confidence must lie in (0, 1), got {confidence!r}.")
    tail = (1 - confidence) / 2
    k = 0
    while k + 1 <= n // 2 and binom.cdf(k, n, 0.5) <= tail:
        k += 1  # P(Binomial(n, 1/2) <= k - 1) <= tail holds for the new k
    out = {"median": float(np.median(x)), "n": int(n), "confidence": confidence}
    if k == 0:
        out.update(ci_low=float("nan"), ci_high=float("nan"),
                   note=f"{n} values are too few for a {confidence:.0%} interval of the median")
    else:
        out.update(ci_low=float(x[k - 1]), ci_high=float(x[n - k]),
                   coverage=float(1 - 2 * binom.cdf(k - 1, n, 0.5)))
    return out


def format_interval(mean: float, low: float, high: float) -> str:
    """``+0.012 [-0.004, +0.028]``, or ``+0.012 [no interval]`` when it is undefined."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return f"{mean:+.3f} [no interval]"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def paired_table(paired_at: dict[str, dict[str, dict[str, Any]]], *,
                 baseline: str = "uniform", unit: str = "seed") -> str:
    """The paired differences to the baseline as a table: one row per arm, one column per k.

    ``paired_at[arm]`` is a :func:`paired_difference_at` result. A cell reads
    ``mean [95 % interval] p=... ahead/behind/tied``.
    """
    if not paired_at:
        return f"(no arm besides {baseline})"
    ks = list(next(iter(paired_at.values())))
    width = max(11, *(len(arm) + 1 for arm in paired_at))
    first = next(iter(next(iter(paired_at.values())).values()))
    level = f"{first['confidence']:.0%}".replace("%", " %")
    lines = [f"minus {baseline}'s value on the same {unit}: mean [{level} interval, paired t over "
             f"{unit}s] p-value ({unit}s ahead/behind/tied)",
             "arm".ljust(width) + "".join(f"  {k:<40s}" for k in ks)]
    notes = set()
    for arm, row in paired_at.items():
        cells = []
        for k in ks:
            c = row[k]
            p = "p=n/a  " if not np.isfinite(c["p_value"]) else f"p={c['p_value']:.3f}"
            cells.append(f"  {format_interval(c['mean'], c['ci_low'], c['ci_high'])} {p} "
                         f"({c['ahead']}/{c['behind']}/{c['tied']})".ljust(42))
            if c.get("note"):
                notes.add(c["note"])
        lines.append(f"{arm:<{width}s}" + "".join(cells).rstrip())
    lines += [f"note: {note}" for note in sorted(notes)]
    return "\n".join(lines)


def plot_paired(ax, ks, paired: dict[str, dict[str, Any]], colors: dict[str, str], *,
                seeds: int, baseline: str = "uniform") -> None:
    """Draw each arm's mean paired difference to the baseline over k, with its interval band.

    ``paired[arm]`` is a :func:`paired_difference` of pass@k curves. With fewer
    than two seeds there is no band, and the title says so.
    """
    level = "95 %"
    for arm, d in paired.items():
        level = f"{d['confidence']:.0%}".replace("%", " %")
        ax.plot(ks, d["mean"], color=colors.get(arm), label=arm)
        low, high = np.asarray(d["ci_low"]), np.asarray(d["ci_high"])
        if np.isfinite(low).any():
            ax.fill_between(ks, low, high, color=colors.get(arm), alpha=0.15)
    ax.axhline(0.0, color="0.3", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(f"pass@k minus {baseline}'s (same seed)")
    if seeds < 2:
        ax.set_title(f"paired difference to {baseline} (one seed: no interval)")
    else:
        ax.set_title(f"paired difference to {baseline}, {level} interval (paired t, {seeds} "
                     "seeds)")
    if paired:
        ax.legend(fontsize=8)
