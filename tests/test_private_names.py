"""No module reaches into another part of the library for its private names.

The rule, checked on the source of ``sera_opt/`` and ``integrations/`` (imported as
``sera_opt.integrations``) with :mod:`ast`:

* A module's *unit* is the part of the library it belongs to: ``sera_opt.X`` for a
  subpackage ``sera_opt/X/`` or a top-level module ``sera_opt/X.py``; every adapter
  under ``integrations/`` belongs to ``sera_opt.integrations``.
* A *private name* starts with one underscore (``_binary``; ``__init__``-style names
  are not private).
* A module may use the private names of its own unit. It may not import a private name
  (``from M import _x``, a module ``M._x`` included) or read one as an attribute of an
  imported module (``M._x``, ``alias._x``) from another unit.
* One exception: the private modules at the root of the package (``sera_opt._jit``,
  ``sera_opt._locking``, ...) are the package's shared internals, and every unit of
  ``sera_opt`` may import them; the adapters under ``integrations/`` may not.

Attribute access on objects (``policy._x``) cannot be resolved statically and is not
checked here; the round seam's public calls are tested in tests/test_rounds_seam.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "integrations":
        parts = ["sera_opt", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def shared_internal(target: str, importer: str) -> bool:
    """A private module at the package root, imported from within sera_opt proper."""
    parts = target.split(".")
    return (len(parts) == 2 and parts[0] == "sera_opt" and is_private(parts[1])
            and unit(importer) != "sera_opt.integrations")


def source_files() -> list[Path]:
    return [p for d in ("sera_opt", "integrations") for p in sorted((REPO / d).rglob("*.py"))
            if "__pycache__" not in p.parts]


def violations(source: str, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """Every use of another unit's private name in ``source`` (the module ``module``)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(source)
    found = []
    aliases: dict[str, str] = {}

    def check(target: str, line: int, text: str) -> None:
        if unit(target) != unit(module) and not shared_internal(target, module):
            found.append(f"{module}:{line}: {text}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("sera_opt"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    aliases[alias.asname or alias.name] = full
                if is_private(alias.name):
                    check(full if full in modules else base, node.lineno,
                          f"from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("sera_opt"):
                    continue
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
                parts = alias.name.split(".")
                for i, part in enumerate(parts):
                    if is_private(part):
                        check(".".join(parts[:i + 1]), node.lineno, f"import {alias.name}")
                        break
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in aliases:
            target = ".".join([aliases[value.id], *reversed(chain)])
            if target not in modules:
                continue  # an attribute of something that is not a module
            full = f"{target}.{node.attr}"
            check(full if full in modules else target, node.lineno, ast.unparse(node))
    return found


def test_no_module_uses_another_units_private_names():
    files = source_files()
    modules = {module_name(p) for p in files}
    found = []
    for path in files:
        found += violations(path.read_text(), module_name(path), path.name == "__init__.py",
                            modules)
    assert not found, "private names used across units:\n" + "\n".join(found)


def test_the_rule_catches_what_it_names():
    modules = {"sera_opt", "sera_opt.rounds", "sera_opt.rounds.session", "sera_opt.policies",
               "sera_opt.policies.base", "sera_opt._jit", "sera_opt.integrations",
               "sera_opt.integrations._common", "sera_opt.integrations.trl"}

    def caught(source, module="sera_opt.policies.base", package=False):
        return violations(source, module, package, modules)

    # Across units: refused, by import and by attribute.
    assert caught("from ..rounds.session import _binary")
    assert caught("from sera_opt.rounds.session import _binary as b")
    assert caught("from sera_opt.rounds import session\nsession._binary(1, 2)")
    assert caught("import sera_opt.rounds.session as s\ns._read_only")
    assert caught("import sera_opt\nsera_opt.rounds.session._binary")
    # The root's private modules: shared within sera_opt, not with the adapters.
    assert not caught("from .. import _jit\n_jit.kernels('x')")
    assert caught("from sera_opt import _jit", module="sera_opt.integrations.trl")
    # Within one unit, and public names anywhere: allowed.
    assert not caught("from .session import _binary", module="sera_opt.rounds.reinforce_ada")
    assert not caught("from . import _common\n_common.x", module="sera_opt.integrations.trl")
    assert not caught("from sera_opt.rounds.session import RoundSession, __all__")
    assert not caught("x = object()\nx._private")
