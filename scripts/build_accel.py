"""Build the optional compiled engine: mypyc over the engine's and the replay's hot modules.

    python scripts/build_accel.py [--out build/accel] [--jobs 2] [--only MOD ...] [--check]

The pure-Python modules stay the reference: this writes C extensions of some of them into
an ignored folder (``build/accel`` by default), and ``bursar.broker.accel`` loads them in
place of the sources only when ``BURSAR_ACCEL`` asks for it and the build still matches
the sources (see that module). Nothing here edits the source tree.

A module mypyc cannot compile (a type error, a construct it rejects) is left out with its
first error printed and the build goes on with the rest: the engine's modules change
often, and one of them failing must not cost the others their speed-up.

Every class stays a plain Python class (mypyc's "non-native" classes: the compiled copy of
a module marks them so, see ``non_native``): the engine's state is pickled by snapshots
through ``__dict__`` and ``__getstate__``, and a snapshot written by either build must
load in the other. The gain comes from the compiled function and
method bodies (typed locals, direct calls between compiled functions, no bytecode loop).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _runtime() -> types.ModuleType:
    """``bursar.broker.accel`` loaded from its file: the build must not import the package
    whose modules it compiles (nor need it installed)."""
    spec = importlib.util.spec_from_file_location("_bursar_accel", ROOT / "broker" / "accel.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while defining
    spec.loader.exec_module(mod)
    return mod


runtime = _runtime()

# The modules worth compiling: where bench_engine and bench_replay spend their time. Data
# modules (events, decisions, codec) stay pure: the journal's encoding introspects them.
# ``ended`` stays pure too: its Mapping subclass, compiled, fails to load (a metaclass
# conflict), which the check after the build would report. ``timers`` stays pure: the
# engine's state holds ``Timers.push`` as a callback, and a compiled method bound to a
# plain class does not pickle.
MODULES: tuple[str, ...] = (
    "bursar.broker.admission",
    "bursar.broker.bucket",
    "bursar.broker.dims",
    "bursar.broker.engine",
    "bursar.broker.isolation",
    "bursar.broker.keys",
    "bursar.broker.ledger",
    "bursar.broker.metering",
    "bursar.broker.paths",
    "bursar.broker.pending",
    "bursar.broker.placement",
    "bursar.broker.pool",
    "bursar.broker.power",
    "bursar.broker.price",
    "bursar.broker.reservations",
    "bursar.broker.shape",
    "bursar.broker.supply",
    "bursar.broker.validation",
    "bursar.sim.replay.kernel",
    "bursar.sim.replay.mapping",
    "bursar.sim.replay.metrics",
    "bursar.sim.replay.profile",
    "bursar.sim.replay.swf",
    "bursar.sim.replay.table",
    "bursar.sim.replay.policies.conservative",
    "bursar.sim.replay.policies.easy",
    "bursar.sim.replay.policies.fifo",
    "bursar.sim.replay.policies.sjf",
)

# bursar.<x> lives in the repository's top-level folder <x> (pyproject's package-dir).
TOP = ("broker", "cli", "protos", "providers", "sim", "workflows")

# "path:line: error: ..." and mypyc's own crashes ("path:line: ValueError: ..."); not notes, warnings.
_ERROR = re.compile(
    r"^(?P<path>[^:\n]+\.py):(?P<line>\d+): (?!note:|warning:)(?:error: )?(?P<msg>.*)$", re.M
)


def stage(src: Path, modules: list[str]) -> None:
    """A ``bursar`` package for mypy to name modules by: links to the sources, and for the
    modules to compile, copies whose classes are all marked non-native (``non_native``)."""
    if src.exists():
        shutil.rmtree(src)
    pkg = src / "bursar"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    compiled = {module_path(src, m) for m in modules}
    for name in TOP:
        for f in sorted((ROOT / name).rglob("*.py*")):
            if f.suffix not in (".py", ".pyi") or "__pycache__" in f.parts:
                continue
            dest = pkg / f.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest in compiled:
                dest.write_text(non_native(f.read_text(), str(f.relative_to(ROOT))))
            else:
                dest.symlink_to(f)


MARK = "@_mypyc_attr(native_class=False)"
IMPORT = "from mypy_extensions import mypyc_attr as _mypyc_attr"


def non_native(text: str, name: str) -> str:
    """``text`` with every top-level class marked ``@mypyc_attr(native_class=False)``: a
    plain Python class, whose instances pickle as the pure build's do (snapshots read
    ``__dict__``). The mark takes the blank line above the class and the import joins the
    ``__future__`` line, so that every line keeps its number (tracebacks point at the
    source); where that cannot be done the build stops and says why."""
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text, name)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if first < 2 or lines[first - 2].strip():
                raise SystemExit(f"{name}:{node.lineno}: no blank line above class {node.name}")
            lines[first - 2] = MARK + "\n"
    future = "from __future__ import annotations\n"
    if future not in lines:
        raise SystemExit(f"{name}: no `{future.strip()}` line to put the mypyc import on")
    at = lines.index(future)
    lines[at] = future.rstrip("\n") + "; " + IMPORT + "\n"
    return "".join(lines)


def subclassed(modules: list[str]) -> dict[str, str]:
    """The modules to leave pure because code that stays pure (or a test) subclasses one
    of their classes: a compiled method refuses an instance of a class it was not
    compiled with. Each with the first such subclass found."""
    compiled = set(modules)
    classes = {m: _class_names(m) for m in modules}
    out: dict[str, str] = {}
    for path in sorted(p for d in (*TOP, "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")):
        rel = path.relative_to(ROOT)
        parts = rel.with_suffix("").parts
        here = ".".join(("bursar", *parts)) if parts[0] in TOP else ".".join(parts)
        here = here.removesuffix(".__init__")
        tree = ast.parse(path.read_bytes(), str(rel))
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = here.split(".")
                base = base[: len(base) - node.level + (path.name == "__init__.py")]
                origin = ".".join([*(base if node.level else []), *filter(None, [node.module])])
                for a in node.names:
                    names[a.asname or a.name] = f"{origin}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        names[a.asname] = a.name
                    else:
                        names[a.name.split(".")[0]] = a.name.split(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                target = _qualified(base, names, here)
                mod, _, cls = (target or "").rpartition(".")
                if mod in compiled and cls in classes[mod] and here not in compiled:
                    out.setdefault(mod, f"{rel}:{node.lineno} subclasses {cls} ({node.name})")
    return out


def _class_names(module: str) -> set[str]:
    path = runtime.source_of(ROOT, module)
    assert path is not None
    tree = ast.parse(path.read_bytes(), str(path))
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def _qualified(node: ast.expr, names: dict[str, str], here: str) -> str | None:
    if isinstance(node, ast.Subscript):  # Generic[...] and the like
        return _qualified(node.value, names, here)
    if isinstance(node, ast.Name):
        return names.get(node.id, f"{here}.{node.id}")
    if isinstance(node, ast.Attribute):
        inner = _qualified(node.value, names, here)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def module_path(src: Path, module: str) -> Path:
    return src.joinpath(*module.split(".")).with_suffix(".py")


def generate(src: Path, temp: Path, modules: list[str]) -> tuple[list[object], str]:
    """mypyc's C for ``modules``; the extensions to build, or none and mypyc's messages."""
    from mypyc.build import mypycify

    paths = [str(module_path(src, m)) for m in modules]
    flags = [
        "--follow-imports=silent",
        "--ignore-missing-imports",
        "--python-version=3.11",
        f"--cache-dir={temp / 'mypy-cache'}",
    ]
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(src)  # mypyc names the generated files after the paths it is given
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exts = mypycify(
                [*flags, *[os.path.relpath(p, src) for p in paths]],
                opt_level="3",
                target_dir=str(temp / "c"),
                group_name=runtime.GROUP,
            )
        return list(exts), out.getvalue()
    except SystemExit:
        return [], out.getvalue()
    finally:
        os.chdir(cwd)


def failing(src: Path, modules: list[str], messages: str) -> dict[str, str]:
    """The modules mypyc's messages fault, each with its first error."""
    by_path = {module_path(src, m).resolve(): m for m in modules}
    bad: dict[str, str] = {}
    for m in _ERROR.finditer(messages):
        p = (src / m["path"]).resolve()
        mod = by_path.get(p)
        if mod is not None and mod not in bad:
            bad[mod] = f"line {m['line']}: {m['msg']}"
    return bad


def compile_c(src: Path, temp: Path, lib: Path, exts: list[object], jobs: int) -> None:
    from setuptools import Distribution

    dist = Distribution({"ext_modules": exts, "script_name": "build_accel"})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(lib)  # type: ignore[attr-defined]
    cmd.build_temp = str(temp / "obj")  # type: ignore[attr-defined]
    cmd.parallel = jobs  # type: ignore[attr-defined]
    cmd.inplace = False  # type: ignore[attr-defined]
    cwd = os.getcwd()
    os.chdir(src)
    try:
        cmd.ensure_finalized()
        cmd.run()
    finally:
        os.chdir(cwd)


def build(out: Path, modules: list[str], jobs: int) -> dict[str, object]:
    t0 = time.perf_counter()
    src, temp, lib = out / "src", out / "tmp", out / "lib"
    if lib.exists():
        shutil.rmtree(lib)  # never leave half of an old build beside a new manifest
    left_out: dict[str, str] = {}
    todo = [m for m in modules if runtime.source_of(ROOT, m) is not None]
    stage(src, todo)
    left_out.update({m: "no such module" for m in modules if m not in todo})
    exts: list[object] = []
    while todo:
        # Checked again after every module left out: one left out may be the subclass.
        bad = subclassed(todo)
        if not bad:
            exts, messages = generate(src, temp, todo)
            if exts:
                break
            bad = failing(src, todo, messages)
        if not bad:
            sys.stderr.write(messages)
            raise SystemExit("mypyc failed outside the modules it compiles; see above")
        for mod, why in bad.items():
            print(f"left out {mod}: {why}", file=sys.stderr)
        left_out.update(bad)
        todo = [m for m in todo if m not in bad]
    if not todo:
        raise SystemExit("no module could be compiled")
    t1 = time.perf_counter()
    compile_c(src, temp, lib, exts, jobs)
    t2 = time.perf_counter()
    manifest = runtime.make_manifest(ROOT, lib, todo)
    manifest["left_out"] = left_out
    manifest["seconds"] = {"mypyc": round(t1 - t0, 1), "cc": round(t2 - t1, 1)}
    (lib / runtime.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    smoke(out, todo)
    return manifest


def smoke(out: Path, modules: list[str]) -> None:
    """Import every compiled module in a fresh process, as ``BURSAR_ACCEL=require`` would;
    a build that fails to load is removed, never left to be found at run time."""
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    env = {**os.environ, runtime.ENV: "require", runtime.ENV_DIR: str(out)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        (out / "lib" / runtime.MANIFEST).unlink()
        raise SystemExit(f"the compiled build does not load, removed:\n{proc.stderr}")


def toolchain_missing() -> str | None:
    """What the build lacks here (a C compiler, Python's headers), or None."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        return f"no Python headers ({include}; the python3-dev package)"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "accel")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", nargs="+", help="compile these modules only")
    ap.add_argument("--check", action="store_true", help="say whether the build is fresh")
    args = ap.parse_args()
    if args.check:
        try:
            files = runtime.check(args.out.resolve(), ROOT)
        except runtime.StaleBuild as e:
            raise SystemExit(f"BURSAR_ACCEL would run the pure-Python engine: {e}") from None
        print(f"the compiled build in {args.out} is fresh: {len(files) - 1} modules")
        return
    missing = toolchain_missing()
    if missing:
        raise SystemExit(f"cannot build the compiled engine: {missing}; the pure one stays in use")
    try:
        import mypyc  # noqa: F401
    except ImportError:
        raise SystemExit("mypyc is not installed: pip install -e '.[accel]'") from None
    manifest = build(args.out.resolve(), list(args.only or MODULES), args.jobs)
    mods = manifest["modules"]
    assert isinstance(mods, dict)
    secs = manifest["seconds"]
    print(f"compiled {len(mods)} modules into {args.out} ({secs})")
    for mod, why in sorted(dict(manifest["left_out"]).items()):  # type: ignore[call-overload]
        print(f"  left out {mod}: {why}")
    print("use it with BURSAR_ACCEL=1; python scripts/build_accel.py --check says if it is fresh")


if __name__ == "__main__":
    main()
