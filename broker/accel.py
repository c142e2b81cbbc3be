"""The optional compiled engine: loading it, and refusing a build that no longer matches.

``make accel`` (``scripts/build_accel.py``) compiles the engine's and the replay's hot
modules with mypyc into ``build/accel/lib``, an ignored folder; the sources are never
touched and stay the reference. ``BURSAR_ACCEL`` decides, once per process, when
``bursar.broker`` (or ``bursar.sim.replay``) is first imported:

* unset, empty or ``0``: the pure-Python modules, whatever is built;
* ``1``: the compiled modules if the build is fresh; otherwise one warning on stderr that
  says why (not built, built for another Python, a source changed since) and the pure
  modules;
* ``require``: the compiled modules, or ``ImportError`` with the same reason (for
  benchmarks and the equivalence test: they must never time or compare the wrong build).

Compiled modules import ``mypy_extensions`` (installed with mypy, the ``accel`` extra):
uninstalling it breaks a build that was fresh; ``make accel`` rebuilds.

``BURSAR_ACCEL_DIR`` names another build folder (the one ``--out`` wrote);
``python scripts/build_accel.py --check`` says whether the build is fresh.

Fresh means: built for this interpreter's extension ABI, and every source the compiled
code was built from (the compiled modules and each ``bursar`` module they import, checked
by SHA-256 against the build's manifest) unchanged. The compiled modules come as one set
or not at all: they call each other directly, so one stale module refuses them all.

This module imports nothing from ``bursar`` (the build script loads it from its file).
"""

from __future__ import annotations

# Only what a process that does not ask for the build needs (the package imports this
# module first, always): the rest is imported where it is used.
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

GROUP = "bursar_accel"
"""mypyc's name for the build's one shared library (``bursar_accel__mypyc``)."""
MANIFEST = "manifest.json"
FORMAT = "bursar-accel/1"
ENV, ENV_DIR = "BURSAR_ACCEL", "BURSAR_ACCEL_DIR"

ROOT = Path(__file__).resolve().parent.parent
"""The repository (``broker/`` is ``bursar.broker``); a build lives in ``ROOT/build``."""
DEFAULT_DIR = ROOT / "build" / "accel"

_TOP = ("broker", "cli", "protos", "providers", "sim", "workflows")


class StaleBuild(ImportError):
    """The compiled build cannot be used; the message says why and how to rebuild."""


def ext_suffix() -> str:
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return suffix if isinstance(suffix, str) else ".so"


def source_of(root: Path, module: str) -> Path | None:
    """The file of ``bursar.<top>.<...>`` under ``root``, or None outside the package."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "bursar" or parts[1] not in _TOP:
        return None
    base = root.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(root: Path, module: str, path: Path) -> Iterable[str]:
    import ast

    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_bytes(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = module.split(".")
                base = pkg[: len(pkg) - node.level + (1 if is_pkg else 0)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield name
            for alias in node.names:
                yield f"{name}.{alias.name}"  # a submodule, when it names one


def sources(root: Path, modules: Iterable[str]) -> list[str]:
    """The compiled modules' files and every ``bursar`` file they import, transitively
    (imports for type checking too: mypyc compiled against their types), as paths
    relative to ``root``, sorted."""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path = source_of(root, mod)
        if path is None or mod == "bursar.broker.accel":
            continue  # this module: the loader, not compiled against
        seen[mod] = path
        todo.extend(n for n in _imports(root, mod, path) if n.startswith("bursar."))
    return sorted({p.relative_to(root).as_posix() for p in seen.values()})


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_manifest(root: Path, lib: Path, modules: Sequence[str]) -> dict[str, object]:
    """What a build is: its compiled modules' files and the sources they were built from."""
    suffix = ext_suffix()
    mods = {}
    for mod in modules:
        rel = Path(*mod.split(".")).with_suffix("").as_posix() + suffix
        if not (lib / rel).is_file():
            raise FileNotFoundError(f"the build has no {rel}")
        mods[mod] = rel
    shared = f"{GROUP}__mypyc{suffix}"
    if not (lib / shared).is_file():
        raise FileNotFoundError(f"the build has no {shared}")
    return {
        "format": FORMAT,
        "ext_suffix": suffix,
        "shared": shared,
        "modules": mods,
        "sources": {rel: _sha256(root / rel) for rel in sources(root, modules)},
    }


def check(build_dir: Path, root: Path = ROOT) -> dict[str, str]:
    """The build's modules (name: extension file) if it is fresh; else ``StaleBuild``."""
    import json

    lib = build_dir / "lib"
    rebuild = "rebuild it with `make accel`, or unset BURSAR_ACCEL"
    try:
        manifest = json.loads((lib / MANIFEST).read_text())
    except FileNotFoundError:
        raise StaleBuild(f"no compiled build in {build_dir}; {rebuild}") from None
    except (OSError, ValueError) as e:
        raise StaleBuild(f"unreadable build manifest in {build_dir} ({e}); {rebuild}") from None
    if manifest.get("format") != FORMAT:
        raise StaleBuild(f"the build in {build_dir} is of another format; {rebuild}")
    if manifest.get("ext_suffix") != ext_suffix():
        raise StaleBuild(
            f"the build in {build_dir} is for {manifest.get('ext_suffix')}, this Python "
            f"loads {ext_suffix()}; {rebuild}"
        )
    changed = []
    for rel, digest in sorted(manifest["sources"].items()):
        path = root / rel
        if not path.is_file() or _sha256(path) != digest:
            changed.append(rel)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if changed[5:] else "")
        raise StaleBuild(
            f"the compiled build is stale: changed since it was built: {shown}; {rebuild}"
        )
    files = {GROUP + "__mypyc": str(lib / manifest["shared"])}
    files.update({mod: str(lib / rel) for mod, rel in manifest["modules"].items()})
    missing = [f for f in files.values() if not Path(f).is_file()]
    if missing:
        raise StaleBuild(f"the build in {build_dir} lacks {missing[0]}; {rebuild}")
    return files


class _Finder:
    """Serves the compiled modules, ahead of every other finder (an extension beside the
    source would win anyway; this one is never beside it)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        import importlib.machinery
        import importlib.util

        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, file)
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


_state: dict[str, object] = {}


def active() -> dict[str, str]:
    """The compiled modules in use in this process (name: file); empty under the pure build."""
    finder = _state.get("finder")
    return dict(finder.files) if isinstance(finder, _Finder) else {}


def activate() -> None:
    """Decide once per process, from ``BURSAR_ACCEL``, which build this process runs."""
    if "decided" in _state:
        return
    _state["decided"] = True
    mode = os.environ.get(ENV, "").strip().lower()
    if mode in ("", "0", "off", "no"):
        return
    build_dir = Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)
    try:
        files = check(build_dir)
        early = sorted(m for m in files if m in sys.modules)
        if early:
            raise StaleBuild(f"pure modules already imported before the compiled ones: {early}")
    except StaleBuild as e:
        _state["refused"] = str(e)
        if mode == "require":
            raise
        print(f"bursar: {ENV}={mode}: running the pure-Python engine: {e}", file=sys.stderr)
        return
    finder = _Finder(files)
    sys.meta_path.insert(0, finder)
    _state["finder"] = finder
