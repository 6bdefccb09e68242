"""A small name -> class registry, kept in preference (registration) order."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .exceptions import SeraOptError


class Registry:
    """Registry of named classes, listed in preference order.

    A class's ``preference`` attribute (lower first; default 100) sets its
    place, then registration order; so the order does not depend on the order
    in which modules happen to be imported. ``kind`` names what is registered
    ("solver", "policy") in error messages.
    """

    def __init__(self, kind: str, plural: str | None = None):
        self.kind = kind
        self._plural = plural or f"{kind}s"
        self._entries: dict[str, type] = {}

    def register(self, cls: type | None = None, *, name: str | None = None,
                 replace: bool = False) -> Callable[[type], type] | type:
        """Register ``cls`` under ``name`` (default ``cls.name``); usable as a decorator."""

        def decorate(c: type) -> type:
            key = name or getattr(c, "name", None)
            if not key or not isinstance(key, str):
                raise SeraOptError(
                    f"a {self.kind} needs a non-empty string `name` to be registered."
                )
            if key in self._entries and not replace and self._entries[key] is not c:
                raise SeraOptError(
                    f"a {self.kind} named {key!r} is already registered "
                    f"({self._entries[key].__qualname__}); pass replace=True to override it."
                )
            self._entries[key] = c
            return c

        return decorate if cls is None else decorate(cls)

    def lookup(self, name: str) -> type:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise SeraOptError(
                f"unknown {self.kind} {name!r}; known {self._plural}, in preference order: "
                f"{', '.join(repr(k) for k in self.names())}."
            ) from None

    def names(self) -> tuple[str, ...]:
        order = sorted(
            enumerate(self._entries.items()),
            key=lambda item: (getattr(item[1][1], "preference", 100), item[0]),
        )
        return tuple(name for _, (name, _cls) in order)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
