"""Regenerate the Python modules of the wire contract from the ``.proto`` files.

    python -m bursar.protos.gen            # rewrite protos/bursar/v1/*_pb2*.py{,i}
    python -m bursar.protos.gen --check    # exit 1 if the committed files are stale
    scripts/gen_protos.sh                  # the same, from the repository root

Layout. The ``.proto`` files live at ``protos/bursar/v1/`` so that their path matches
their package (``bursar.v1``), as protoc and buf expect; protoc runs with ``-I protos``
and registers them as ``bursar/v1/broker.proto`` and ``bursar/v1/admin.proto`` (the
names server reflection reports). The generated modules are written next to them, and
``protos/`` is installed as ``bursar.protos``, so they import as::

    from bursar.protos.bursar.v1 import broker_pb2, broker_pb2_grpc, admin_pb2

protoc writes cross-file imports as ``from bursar.v1 import broker_pb2`` and names the
generated classes' module ``bursar.v1.broker_pb2``; this script rewrites that prefix to
``bursar.protos.bursar.v1`` (the only edits made to protoc's output), so that the
generated code imports, and its messages pickle, inside the installed package.

The generated files are committed and must match what this script produces byte for
byte (``tests/service/test_protos.py`` checks); the ``grpcio-tools`` version is pinned in
``pyproject.toml`` because protoc's output differs between versions.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

__all__ = ["GENERATED_SUFFIXES", "PROTO_ROOT", "check", "generate", "proto_files"]

PROTO_ROOT = Path(__file__).resolve().parent
"""The ``-I`` root: ``protos/`` in the repository."""

PACKAGE_DIR = Path("bursar") / "v1"
"""Where the ``.proto`` files (and the generated modules) live under ``PROTO_ROOT``."""

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

_REWRITES = (
    # Cross-file imports: ``from bursar.v1 import broker_pb2 as ...``.
    (re.compile(r"^(from|import) bursar\.v1\b", re.MULTILINE), r"\1 bursar.protos.bursar.v1"),
    # The module name given to generated classes (their ``__module__``, used by pickle).
    (
        re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'bursar\.v1\."),
        r"\1'bursar.protos.bursar.v1.",
    ),
)


def proto_files() -> list[Path]:
    """The ``.proto`` sources, relative to ``PROTO_ROOT``, sorted."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every source into ``out_root`` (``out_root/bursar/v1/...``).

    Returns the generated files, relative to ``out_root``. Raises RuntimeError if protoc
    fails (its message is on stderr).
    """
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - dev dependency
        raise RuntimeError(
            "grpc_tools is not installed; install the dev extras: pip install -e '.[dev]'"
        ) from exc
    well_known = resources.files("grpc_tools").joinpath("_proto")
    out_root.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with status {rc}: {' '.join(args)}")
    out = []
    for src in proto_files():
        stem = src.name.removesuffix(".proto")
        for suffix in GENERATED_SUFFIXES:
            rel = src.parent / f"{stem}{suffix}"
            path = out_root / rel
            text = path.read_text(encoding="utf-8")
            for pattern, replacement in _REWRITES:
                text = pattern.sub(replacement, text)
            path.write_text(text, encoding="utf-8")
            out.append(rel)
    return out


def check() -> list[str]:
    """Regenerate into a temporary directory and compare with the committed files.

    Returns one line per problem (a file missing or different, with a short diff); an
    empty list means the committed code matches the ``.proto`` files byte for byte.
    """
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bursar-protos-") as tmp:
        root = Path(tmp)
        for rel in generate(root):
            fresh = (root / rel).read_bytes()
            committed_path = PROTO_ROOT / rel
            if not committed_path.exists():
                problems.append(f"{committed_path} is missing")
                continue
            committed = committed_path.read_bytes()
            if committed != fresh:
                diff = difflib.unified_diff(
                    committed.decode(errors="replace").splitlines(),
                    fresh.decode(errors="replace").splitlines(),
                    f"committed/{rel}",
                    f"regenerated/{rel}",
                    lineterm="",
                    n=1,
                )
                problems.append(f"{committed_path} differs:\n" + "\n".join(list(diff)[:20]))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bursar.protos.gen",
        description="Regenerate Bursar's Python gRPC modules from protos/bursar/v1/*.proto.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="Do not write; exit 1 if the committed generated files differ from protoc's output.",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run scripts/gen_protos.sh to regenerate", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    for rel in generate(PROTO_ROOT):
        print(PROTO_ROOT / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
