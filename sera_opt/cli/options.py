"""The command line's policy options: ``--option key=value`` read exactly (whole numbers
as ints, no silent float rounding) and the policy built and checked from them."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import warnings
from decimal import Decimal, InvalidOperation

from ..exceptions import SeraOptError, SeraOptWarning
from ..policies import POLICIES, SERAPolicy, get_policy
from .errors import one_line

# Whole numbers on the command line are read exactly as Python ints; beyond this many
# digits no budget can be spent and Python refuses to print the number (its 4300-digit
# limit), so the parser stops there instead of in a library error message.
MAX_DIGITS = 1000


# Options that have their own flag; taking them through --option too would let the two
# disagree silently.
_OPTION_FLAGS = {"min_rollouts": "--min", "max_rollouts": "--max", "offset": "--offset",
                 "solver": "--solver"}


def whole_number(text: str) -> int:
    """Parse a command-line count exactly: ``24``, ``1_000``, ``1e6`` and ``24.0`` are whole."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; give a whole number such as 24."
        ) from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give a whole number.")
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number; rollouts are counted in whole numbers."
        )
    if value and value.adjusted() >= MAX_DIGITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} has more than {MAX_DIGITS} digits; no count that large can be allocated."
        )
    return int(value)


def _shortened(text: str, width: int = 60) -> str:
    """``text`` for a message: a value pasted by mistake can be megabytes long."""
    return text if len(text) <= width else f"{text[:width - 20]}...({len(text)} characters)"


def _option_value(key: str, text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    word = text.strip().lower()
    if word in ("inf", "+inf", "infinity", "-inf", "-infinity", "nan"):
        return float(word)
    if word in ("true", "false", "none", "null"):
        raise SeraOptError(f"--option {key}={text}: write True, False or None (capitalized, "
                           f"as in Python).")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", text):
        return text  # a bare name, such as a solver's, needs no quotes
    raise SeraOptError(
        f"--option {key}={_shortened(text)}: the value is not a Python literal; write a "
        f"number, True, False, None, a quoted string or a list such as [1, 2]."
    )


def _parse_options(items: list[str]) -> dict:
    options: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise SeraOptError(f"--option takes KEY=VALUE (for example alpha=2), got {item!r}.")
        if key in _OPTION_FLAGS:
            raise SeraOptError(f"set {key} with {_OPTION_FLAGS[key]}, not with --option.")
        if key in options:
            raise SeraOptError(f"--option {key} is given twice; keep one.")
        options[key] = _option_value(key, text)
    return options


def _policy_parameters(cls) -> str:
    """The keyword options of a policy's constructor, for an error's hint."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return ""
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""  # it takes more than it names
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _OPTION_FLAGS]
    return f" Its options: {', '.join(names) or 'none'} (and --min, --max, --offset)."


def build_policy(args):
    options = _parse_options(args.option)
    name = "sera" if args.policy is None else args.policy
    cls = POLICIES.lookup(name)  # an unknown name lists the known ones
    kwargs = {**options, "offset": args.offset}
    if args.min is not None:
        kwargs["min_rollouts"] = args.min
    if args.max is not None:
        kwargs["max_rollouts"] = args.max
    if args.solver is not None:
        if not issubclass(cls, SERAPolicy):
            raise SeraOptError(f"--solver chooses SERA's solver; policy {name!r} has none, so "
                               f"drop --solver (or use --policy sera).")
        kwargs["solver"] = args.solver
    try:
        with warnings.catch_warnings():
            # An option that the policy or its solver ignores was typed for a reason:
            # refuse it instead of printing Python's warning and running without it.
            warnings.simplefilter("error", SeraOptWarning)
            return get_policy(name, **kwargs)
    except SeraOptWarning as exc:
        takes = [n for n in cls.all_option_names() if n not in _OPTION_FLAGS]
        raise SeraOptError(
            f"{one_line(exc).rstrip('.')}, so --option would have no effect; remove it. "
            f"Policy {name!r} takes --option {', '.join(takes) or '(none)'} "
            f"(and --min, --max, --offset"
            f"{', --solver' if issubclass(cls, SERAPolicy) else ''})."
        ) from None
    except SeraOptError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise SeraOptError(f"policy {name!r} rejected {given}: {exc}."
                           f"{_policy_parameters(cls)}") from None
