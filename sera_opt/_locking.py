"""A lock that travels with an object's state: dropped when pickled or deep-copied,
made anew when restored (a lock cannot be pickled)."""

from __future__ import annotations

import threading
from typing import Any


class LockedState:
    """Mixin for classes whose state is guarded by ``self._lock`` (an RLock)."""

    _lock: threading.RLock

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
