"""Which compiled modules a package loads: the optional accelerated build (``make accel``,
built by ``bursar.broker.accel``) of the replay's and the elastic allocator's hottest
modules.

A package that holds such a module calls ``use`` when it is imported: the compiled modules
are loaded instead of the source only if every one of them was built from the source as
it is now, for this Python; a stale build is ignored with one warning (rebuild it, or
``make accel-clean``). ``BURSAR_PURE=1`` always loads the source, and
``BURSAR_ACCEL_DIR`` names a build made elsewhere. Apart from ``accel`` (which builds), so
that the broker's package can load its modules without importing the build's command line
(``python -m bursar.broker.accel`` would run a module its package had already imported).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MODULES: dict[str, tuple[str, ...]] = {
    "bursar.sim.replay": ("profile",),
    "bursar.sim.replay.policies": ("conservative",),
    "bursar.broker": ("elastic",),
}
"""What is compiled, by package: the availability profile and conservative backfill's
compression pass, where a full-trace conservative replay spends nearly all its time; the
elastic allocator's model (its intents, the leases' state, keys, jumps and gains, and
admission control's plan), where a ``bursar sim elastic`` run spends the most. Not its
handlers in the engine (``elastic_fold``): compiled, their reads of the engine's Python
objects (requests, campaigns) were slower than the interpreter's with thousands of elastic
leases (``docs/results/elastic.md``). Nor the rest of the engine: compiling it gained too
little (``docs/results/replay.md``), and each of its state classes would need its
pickling spelled out, as the allocator's classes have (snapshots pickle the engine)."""

ACCEL_DIR = "_accel"
MANIFEST = "manifest.json"
_warned: set[str] = set()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _folder(package: str, source_dir: Path) -> Path:
    """Where a package's compiled modules live: ``BURSAR_ACCEL_DIR`` (a build elsewhere,
    laid out by package) or the ``_accel`` folder beside the source."""
    root = os.environ.get("BURSAR_ACCEL_DIR")
    if root:
        return Path(root, *package.split(".")[1:], ACCEL_DIR)
    return source_dir / ACCEL_DIR


def use(package: str, path: list[str]) -> bool:
    """Called by ``package``'s ``__init__`` with its ``__path__``: put its compiled modules
    first on the path if they are built from the current source. True if they are."""
    if os.environ.get("BURSAR_PURE") or package not in MODULES:
        return False
    source_dir = Path(path[0])
    folder = _folder(package, source_dir)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    try:
        built = json.loads(manifest.read_text())
        fresh = built.get("python") == sys.implementation.cache_tag and all(
            built.get("sources", {}).get(m) == digest(source_dir / f"{m}.py")
            for m in MODULES[package]
        )
    except (OSError, ValueError, AttributeError):
        fresh = False
    if not fresh:
        if package not in _warned:
            _warned.add(package)
            log.warning(
                "the accelerated build of %s is stale or for another Python (its source "
                "changed since it was built); running the pure-Python modules. Rebuild it "
                "with `make accel`, or remove it with `make accel-clean`.",
                package,
            )
        return False
    path.insert(0, str(folder))
    return True


def active() -> dict[str, bool]:
    """Which of the compiled modules are loaded (imports them)."""
    out = {}
    for package, modules in MODULES.items():
        for m in modules:
            mod = importlib.import_module(f"{package}.{m}")
            out[f"{package}.{m}"] = not str(getattr(mod, "__file__", "")).endswith(".py")
    return out
