"""The policy registry: names in preference order, built with options, rebuilt from a
configuration (:meth:`~sera_opt.AllocationPolicy.config`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._registry import Registry
from ..exceptions import SeraOptError
from .base import AllocationPolicy, unknown_option_error

__all__ = ["POLICIES", "available_policies", "get_policy", "policy_from_config",
           "register_policy"]

POLICIES = Registry("policy", "policies")


def register_policy(cls=None, *, name: str | None = None, replace: bool = False):
    """Register an :class:`AllocationPolicy` subclass (usable as a decorator)."""
    def check(c):
        if not (isinstance(c, type) and issubclass(c, AllocationPolicy)):
            raise SeraOptError(f"register_policy takes AllocationPolicy subclasses, got {c!r}.")
        return POLICIES.register(c, name=name, replace=replace)

    return check if cls is None else check(cls)


def get_policy(name, **options) -> AllocationPolicy:
    """Build the policy registered as ``name`` with ``options``.

    An :class:`AllocationPolicy` instance is returned as is (options must then
    be empty). Unknown names and options raise :class:`~sera_opt.SeraOptError`
    listing the valid ones.
    """
    if isinstance(name, AllocationPolicy):
        if options:
            raise SeraOptError(
                "options cannot be applied to an existing policy instance; build a new one."
            )
        return name
    cls = POLICIES.lookup(name)
    unknown = cls.unknown_options(options)
    if unknown:
        raise unknown_option_error(f"policy {name!r}", unknown,
                                   cls.accepted_option_names(options))
    return cls(**options)


def policy_from_config(config: Mapping[str, Any], **objects: Any) -> AllocationPolicy:
    """Rebuild a policy from :meth:`AllocationPolicy.config`.

    ``objects`` supply the options that the configuration could only name (a
    user's solver: ``solver=my_solver``); each must carry the name recorded.
    """
    if not isinstance(config, Mapping) or "name" not in config or "options" not in config:
        raise SeraOptError(
            "a policy configuration is a mapping with 'name' and 'options', as "
            "AllocationPolicy.config() returns."
        )
    name, options = config["name"], config["options"]
    if not isinstance(name, str):
        raise SeraOptError(
            f"a policy configuration's 'name' is a registered policy name (a string), got "
            f"{name!r}; known policies: {', '.join(map(repr, POLICIES.names()))}."
        )
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise SeraOptError(
            f"a policy configuration's 'options' is a mapping from option names (strings) to "
            f"values, as AllocationPolicy.config() returns; got {options!r}."
        )
    options = dict(options)
    for key, value in options.items():
        if isinstance(value, Mapping) and set(value) == {"object", "name"}:
            given = objects.get(key)
            if given is None:
                raise SeraOptError(
                    f"the configuration's option {key!r} is an unregistered {value['object']} "
                    f"named {value['name']!r}; pass it again ({key}=...) or register it."
                )
            if getattr(given, "name", None) != value["name"]:
                raise SeraOptError(
                    f"the {value['object']} passed as {key!r} is named "
                    f"{getattr(given, 'name', None)!r}, the configuration names "
                    f"{value['name']!r}."
                )
            options[key] = given
    extra = sorted(set(objects) - set(options))
    if extra:
        raise SeraOptError(
            f"policy {name!r}: {', '.join(map(repr, extra))} passed to policy_from_config "
            f"but not in the configuration's options ({', '.join(options) or 'none'})."
        )
    try:
        return get_policy(name, **options)
    except TypeError as exc:  # a policy whose constructor lacks a declared option
        raise SeraOptError(f"policy {name!r} cannot be built from this configuration: {exc}"
                           ) from exc


def available_policies() -> tuple[str, ...]:
    """Registered policy names, in preference order."""
    return POLICIES.names()
