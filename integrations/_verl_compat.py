"""verl 0.9.1 beside trl 1.16: let verl's ``apply_monkey_patch`` run when trl lacks the class it patches.

Every verl actor runs ``verl.models.transformers.monkey_patch.apply_monkey_patch``
on the model it builds. In verl 0.9.1 that function does::

    if is_trl_available():
        try:
            from trl.experimental.ppo import AutoModelForCausalLMWithValueHead
        except ImportError:
            from trl import AutoModelForCausalLMWithValueHead
        AutoModelForCausalLMWithValueHead.state_dict = state_dict

``is_trl_available`` only asks whether a package named ``trl`` can be found.
trl 1.16 has no ``AutoModelForCausalLMWithValueHead`` in either place, so with
trl installed the import fails and the actor dies at start-up with
``ImportError: cannot import name 'AutoModelForCausalLMWithValueHead' from 'trl'``.

:func:`apply` makes that one check answer the question the code behind it asks,
"can trl's value-head class be imported?", and nothing else:

* only when the fix is needed: trl can be found, but the class is importable
  from neither ``trl.experimental.ppo`` nor ``trl`` (trl releases that still
  have it, and environments without trl, are left exactly as they were);
* only the name ``is_trl_available`` inside verl's ``monkey_patch`` module is
  replaced; ``verl.utils.import_utils.is_trl_available`` and its other caller
  (``verl.utils.model.load_valuehead_model``, which needs the same class and
  fails on trl 1.16 with or without this fix) are untouched;
* the replacement answers False, so ``apply_monkey_patch`` skips patching the
  ``state_dict`` of a class that does not exist and goes on with the rest of its
  work; the first time it does so in a process it logs a warning (logger
  ``sera_opt.integrations.verl``). A log record, not :func:`warnings.warn`: verl's
  FSDP engine calls ``apply_monkey_patch`` inside ``warnings.simplefilter("ignore")``,
  which would swallow a Python warning.

:mod:`sera_opt.integrations.verl` calls :func:`apply` when it is imported, which
covers every process that imports it: the launcher and its task runner, and
every verl process when ``VERL_USE_EXTERNAL_MODULES=sera_opt.integrations.verl``
is set (the launcher sets it for verl's Ray workers).
"""

from __future__ import annotations

import importlib
import logging
import warnings

__all__ = [
    "VALUE_HEAD_CLASS",
    "VALUE_HEAD_MODULES",
    "applied",
    "apply",
    "needed",
    "trl_value_head_available",
]

#: The trl class verl's ``apply_monkey_patch`` patches when trl is installed.
VALUE_HEAD_CLASS = "AutoModelForCausalLMWithValueHead"

#: Where verl 0.9.1 looks for it, in its order.
VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")

_MONKEY_PATCH_MODULE = "verl.models.transformers.monkey_patch"
logger = logging.getLogger("sera_opt.integrations.verl")
_warned = False


def trl_value_head_available() -> bool:
    """True when ``AutoModelForCausalLMWithValueHead`` imports from trl where verl looks for it."""
    for module_name in VALUE_HEAD_MODULES:
        with warnings.catch_warnings():
            # trl warns on every import of trl.experimental; this probe is not a use of it.
            warnings.filterwarnings("ignore", message=r".*trl\.experimental")
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        try:
            getattr(module, VALUE_HEAD_CLASS)
        except (AttributeError, ImportError):  # trl's lazy module raises either
            continue
        return True
    return False


def needed() -> bool:
    """True when verl's own check finds trl but trl has no value-head class to patch."""
    from verl.utils.import_utils import is_trl_available

    return bool(is_trl_available()) and not trl_value_head_available()


def _is_trl_value_head_available() -> bool:
    """Stands in for verl's ``is_trl_available`` inside ``apply_monkey_patch`` (see the module)."""
    global _warned
    if not _warned:
        _warned = True
        import trl

        logger.warning(
            "verl's apply_monkey_patch skips patching trl's %s.state_dict: trl %s has no such "
            "class (sera_opt.integrations.verl answers verl's is_trl_available check for that "
            "code only; see docs/integrations/verl.md, 'verl beside trl').",
            VALUE_HEAD_CLASS,
            getattr(trl, "__version__", "?"),
        )
    return False


_is_trl_value_head_available.sera_opt_verl_trl_fix = True  # marks the stand-in


def applied() -> bool:
    """True when verl's ``apply_monkey_patch`` uses the stand-in check in this process."""
    import sys

    module = sys.modules.get(_MONKEY_PATCH_MODULE)
    check = getattr(module, "is_trl_available", None)
    return bool(getattr(check, "sera_opt_verl_trl_fix", False))


def apply() -> bool:
    """Install the stand-in check when the installed versions need it (idempotent).

    Returns
    -------
    bool
        Whether the stand-in is in place after the call.
    """
    if applied():
        return True
    if not needed():
        return False
    module = importlib.import_module(_MONKEY_PATCH_MODULE)
    if not hasattr(module, "is_trl_available"):  # pragma: no cover - a verl without the check
        return False
    module.is_trl_available = _is_trl_value_head_available
    return True
