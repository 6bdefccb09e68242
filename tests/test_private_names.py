"""No module reaches into another part of the library for its private names.

The rules, checked on the source of ``sera_opt/``, ``integrations/`` and ``benchmarks/``
(installed as ``sera_opt.integrations`` and ``sera_opt.benchmarks``) with :mod:`ast`:

* A module's *unit* is the part of the library it belongs to: ``sera_opt.X`` for a
  subpackage ``sera_opt/X/`` or a top-level module ``sera_opt/X.py``; every adapter
  under ``integrations/`` belongs to ``sera_opt.integrations``, every benchmark under
  ``benchmarks/`` to ``sera_opt.benchmarks``.
* A *private name* starts with one underscore (``_binary``; ``__init__``-style names
  are not private).
* Names of modules. A module may use the private names of its own unit. It may not
  import a private name (``from M import _x``, a module ``M._x`` included) or read one
  as an attribute of an imported module (``M._x``, ``alias._x``) from another unit. One
  exception: the private modules at the root of the package (``sera_opt._jit``,
  ``sera_opt._locking``, ...) are the package's shared internals, and every unit of
  ``sera_opt`` may import them; the adapters and the benchmarks may not.
* Attributes of objects. ``x._name``, where ``x`` is anything but ``self``, ``cls``,
  ``super()`` or an imported sera_opt module (the rule above), is allowed only in a
  module that itself defines ``_name``: as a function, method or class, an assignment
  target (``_name = ...``, ``obj._name = ...``), an entry of ``__slots__``, or the name
  string of a ``setattr``-like call or a ``__dict__[...]`` key. A class's private
  attributes are the state of the module that defines it; another module, even of the
  same unit, goes through public names (``Allocation.from_solver_counts``,
  ``problem.stored_bounds``). The check is by name, not by type: a module that defines
  ``_name`` for its own classes may read it on any object.
* :data:`FOREIGN` lists the private attributes of other libraries that a module must
  touch, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The units installed from outside sera_opt/: they use the package as its users do.
ADAPTERS = ("sera_opt.integrations", "sera_opt.benchmarks")

#: (module, private attribute) -> why that module reads another library's private name.
FOREIGN = {
    ("sera_opt._jit", "_cache_file"): "numba: a dispatcher's cache has no public path to "
                                      "its index file, which _evict removes",
    ("sera_opt._jit", "_index_path"): "numba: the index file of a dispatcher's cache",
    ("sera_opt.rounds.session", "_getframe"): "Python's sys: the caller's frame, to name "
                                              "the caller in a message",
    ("sera_opt.integrations.verl_cpu", "_engines"): "verl: EngineRegistry has no lookup "
                                                    "that leaves an entry absent",
    ("sera_opt.integrations.verl_cpu", "_ROLLOUT_REGISTRY"): "verl: the only way to add "
                                                             "an async rollout class",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] in ("integrations", "benchmarks"):
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
            and unit(importer) not in ADAPTERS)


def source_files() -> list[Path]:
    return [p for d in ("sera_opt", "integrations", "benchmarks")
            for p in sorted((REPO / d).rglob("*.py")) if "__pycache__" not in p.parts]


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
    own = defined_names(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        value = node.value
        if isinstance(value, ast.Name) and (value.id in ("self", "cls") or value.id in aliases):
            continue  # one's own object, or a module (the names rule above)
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "super"):
            continue
        if node.attr in own or (module, node.attr) in FOREIGN:
            continue
        found.append(f"{module}:{node.lineno}: {ast.unparse(node)} (an attribute this "
                     f"module does not define)")
    return found


def defined_names(tree: ast.AST) -> set[str]:
    """The private names a module defines (the attribute rule's list)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif (isinstance(node, ast.Call) and len(node.args) >= 2
              and "setattr" in ast.unparse(node.func)
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names.add(node.args[1].value)
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "__dict__" and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str)):
            names.add(node.slice.value)
    return {name for name in names if is_private(name)}


def test_no_module_uses_another_units_private_names():
    files = source_files()
    modules = {module_name(p) for p in files}
    found = []
    for path in files:
        found += violations(path.read_text(), module_name(path), path.name == "__init__.py",
                            modules)
    assert not found, "private names used across units:\n" + "\n".join(found)


def test_every_foreign_entry_is_still_needed():
    """An exception that no module uses any more is removed, not kept as a loophole."""
    used = set()
    for path in source_files():
        module = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (module, node.attr) in FOREIGN:
                used.add((module, node.attr))
    assert set(FOREIGN) == used, f"FOREIGN entries no module reads: {set(FOREIGN) - used}"


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
    # Attributes of objects: only in the module that defines the name.
    assert caught("from sera_opt.result import Allocation\nAllocation._trusted(p, c)")
    assert caught("def f(problem):\n    return problem._lo, problem._hi")
    assert caught("x = object()\nx._private")
    assert not caught("class A:\n    def _x(self):\n        return 1\n\n"
                      "def f(a):\n    return a._x()")
    assert not caught("class A:\n    __slots__ = ('_lo',)\n\ndef f(a):\n    return a._lo")
    assert not caught("def f(self, other):\n    other._y = self._y\n    return other._y")
    # Benchmarks use the package as its users do: no root internals.
    assert caught("from sera_opt import _jit", module="sera_opt.benchmarks.default_path")


def test_a_planted_private_access_in_a_real_module_fails_the_check():
    """A real module with one line that reads another module's private attribute."""
    files = source_files()
    modules = {module_name(p) for p in files}
    path = REPO / "sera_opt" / "policies" / "core.py"
    source = path.read_text()
    assert not violations(source, "sera_opt.policies.core", False, modules)
    planted = source + "\n\ndef _planted(tracker):\n    return tracker._estimate_and_repeats([1])\n"
    found = violations(planted, "sera_opt.policies.core", False, modules)
    assert len(found) == 1 and "tracker._estimate_and_repeats" in found[0], found
