"""The optional accelerated build: the replay's and the elastic allocator's hottest modules
compiled with mypyc.

``make accel`` (or ``python -m bursar.broker.accel build``) compiles the modules in
``compiled.MODULES`` from their typed Python source into C extensions, in a ``_accel``
folder beside each source with a manifest of the sources' SHA-256; ``compiled.use``
decides, when a package is imported, whether they are loaded.

The pure-Python modules stay the reference and the fallback: both give the same
schedules, decisions and snapshots, byte for byte (``tests/engine/test_accel.py`` compares
their digests, run hashes and pickles). Where no C compiler or Python headers are present
the build stops with a message and everything runs as pure Python, with the same results.

mypyc (part of mypy) rather than Cython: the modules are already typed Python and stay
the one source, with no second dialect to keep in step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from bursar.broker.compiled import ACCEL_DIR, MANIFEST, MODULES, active, digest

# The setup script mypyc's command line writes, with the group named for the package, so
# that the shared library of a package's modules is a module of that package (found in
# the same folder) and not a top-level one.
_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(name="bursar-accel", ext_modules=mypycify({paths!r}, opt_level="3", group_name={group!r}))
"""


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
        import mypyc
    except ImportError:
        raise RuntimeError(
            "mypyc is not installed: pip install 'bursar-broker[accel]' (it comes with mypy)"
        ) from None
    sources = _sources()
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="bursar-accel-") as tmp:
        work = Path(tmp)
        # As mypyc's own command line runs its setup script: mypyc's installation, then
        # the build root (so that mypy resolves ``bursar`` to the copy it compiles).
        mypyc_root = str(Path(mypyc.__path__[0]).parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((mypyc_root, str(work)))}
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
            # A package's modules in one compilation, so that they call each other natively.
            targets = [str(Path("bursar", rel, f"{m}.py")) for m in modules]
            setup = work / "build" / f"setup_{package.replace('.', '_')}.py"
            setup.parent.mkdir(exist_ok=True)
            setup.write_text(
                _SETUP.format(
                    paths=["--ignore-missing-imports", *targets], group=f"{package}.accel"
                )
            )
            proc = subprocess.run(
                [sys.executable, str(setup.relative_to(work)), "build_ext", "--inplace"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                names = ", ".join(f"{package}.{m}" for m in modules)
                raise RuntimeError(
                    f"mypyc failed on {names}:\n{(proc.stdout + proc.stderr)[-4000:]}"
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
                        "sources": {m: digest(sources[package] / f"{m}.py") for m in modules},
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
        prog="python -m bursar.broker.accel",
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
        print(f"built {len(files)} extension files; status: python -m bursar.broker.accel status")
    elif a.action == "clean":
        for d in clean():
            print(f"removed {d}")
    else:
        for name, on in active().items():
            print(f"{name}: {'compiled' if on else 'pure Python'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
