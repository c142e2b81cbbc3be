"""The optional accelerated build: the replay's hottest modules compiled with mypyc.

``make accel`` (or ``python -m bursar.sim.accel build``) compiles the modules in
``MODULES`` from their typed Python source into C extensions, in a ``_accel`` folder beside
each source with a manifest of the sources' SHA-256. A package that holds such a module
calls ``use`` when it is imported: the compiled modules are loaded instead of the source
only if every one of them was built from the source as it is now; a stale build is
ignored with one warning (rebuild it, or ``make accel-clean``). ``BURSAR_PURE=1`` always
loads the source.

The pure-Python modules stay the reference and the fallback: both give the same
schedules, byte for byte (``tests/engine/test_accel.py`` compares their digests). Where no C
compiler or Python headers are present the build stops with a message and everything
runs as pure Python, with the same results.

mypyc (part of mypy) rather than Cython: the modules are already typed Python and stay
the one source, with no second dialect to keep in step.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MODULES: dict[str, tuple[str, ...]] = {
    "bursar.sim.replay": ("profile",),
    "bursar.sim.replay.policies": ("conservative",),
}
"""What is compiled, by package: the availability profile and conservative backfill's
compression pass, where a full-trace conservative replay spends nearly all its time."""

ACCEL_DIR = "_accel"
MANIFEST = "manifest.json"
_warned: set[str] = set()


def _digest(path: Path) -> str:
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
            built.get("sources", {}).get(m) == _digest(source_dir / f"{m}.py")
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


def _sources() -> dict[str, Path]:
    """Each package's source folder (an editable install or a wheel)."""
    return {p: Path(importlib.import_module(p).__path__[-1]) for p in MODULES}


def build(out_root: Path | None = None) -> list[Path]:
    """Compile ``MODULES`` with mypyc; return the extension files written. ``out_root``:
    lay them out there by package (for ``BURSAR_ACCEL_DIR``) instead of beside the
    sources. Raises ``RuntimeError`` with what to install when it cannot."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        raise RuntimeError(
            "no C compiler (cc) found: install one (Debian: apt-get install gcc) for the "
            "accelerated build; without it the pure-Python modules run, with the same results"
        )
    include = sysconfig.get_paths().get("include")
    if not include or not Path(include, "Python.h").is_file():
        raise RuntimeError(
            f"no Python headers (Python.h in {include}): install them (Debian: apt-get "
            "install python3-dev) for the accelerated build"
        )
    try:
        import mypyc  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "mypyc is not installed: pip install 'bursar-broker[accel]' (it comes with mypy)"
        ) from None
    sources = _sources()
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="bursar-accel-") as tmp:
        work = Path(tmp)
        # mypyc names a module by its path from the build root: lay the packages out as
        # bursar/... (the repository maps bursar.sim to sim/ and so on).
        bursar = work / "bursar"
        bursar.mkdir()
        (bursar / "__init__.py").write_text("")
        for name in ("sim", "broker"):
            src = Path(importlib.import_module(f"bursar.{name}").__path__[-1])
            shutil.copytree(src, bursar / name, ignore=shutil.ignore_patterns(ACCEL_DIR, "*.so"))
        for package, modules in MODULES.items():
            rel = Path(*package.split(".")[1:])
            for m in modules:
                target = Path("bursar", rel, f"{m}.py")
                proc = subprocess.run(
                    [sys.executable, "-m", "mypyc", "--ignore-missing-imports", str(target)],
                    cwd=work,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"mypyc failed on {package}.{m}:\n{(proc.stdout + proc.stderr)[-4000:]}"
                    )
            dest = Path(out_root, rel, ACCEL_DIR) if out_root else sources[package] / ACCEL_DIR
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            for so in (work / "bursar" / rel).glob("*.so"):
                shutil.copy2(so, dest / so.name)
                written.append(dest / so.name)
            (dest / MANIFEST).write_text(
                json.dumps(
                    {
                        "python": sys.implementation.cache_tag,
                        "sources": {m: _digest(sources[package] / f"{m}.py") for m in modules},
                    },
                    indent=1,
                    sort_keys=True,
                )
            )
    return written


def clean() -> list[Path]:
    """Remove the accelerated build from beside the sources."""
    removed = []
    for folder in _sources().values():
        d = folder / ACCEL_DIR
        if d.exists():
            shutil.rmtree(d)
            removed.append(d)
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bursar.sim.accel",
        description="Build, check or remove the optional mypyc-compiled replay modules.",
    )
    ap.add_argument("action", choices=("build", "clean", "status"))
    a = ap.parse_args(argv)
    if a.action == "build":
        try:
            files = build()
        except RuntimeError as exc:
            print(f"accelerated build not made: {exc}", file=sys.stderr)
            return 1
        print(f"built {len(files)} extension files; status: python -m bursar.sim.accel status")
    elif a.action == "clean":
        for d in clean():
            print(f"removed {d}")
    else:
        for name, on in active().items():
            print(f"{name}: {'compiled' if on else 'pure Python'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
