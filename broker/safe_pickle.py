"""Loading the broker's own pickles (snapshots) without loading anyone else's objects.

A snapshot is as trusted as the journal beside it; this refuses any class outside
``bursar`` and the standard containers, as a guard against a foreign or damaged file,
not as a sandbox.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_ALLOWED = {
    ("builtins", n) for n in ("getattr", "set", "frozenset", "dict", "list", "tuple", "object")
} | {
    ("copyreg", "_reconstructor"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("sortedcontainers.sortedlist", "SortedList"),
    ("sortedcontainers.sortedlist", "SortedKeyList"),
    ("sortedcontainers.sorteddict", "SortedDict"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("bursar.") or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a snapshot may not refer to {module}.{name}")


def loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()
