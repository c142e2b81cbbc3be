"""The documentation site's generated reference pages, built from the source at each build.

A MkDocs hook (``hooks:`` in mkdocs.yml): ``on_files`` adds two pages that exist only in
the built site, so nothing here is written twice:

* ``reference/configuration.md``: every key of a config file, walked from the pydantic
  schema in ``broker/config.py`` (type, default, allowed values); each key's description
  is the field's own, else the attribute docstring of the dataclass the engine reads it
  into (``PolicySpec``, ``PoolSpec``, ``NodeGroup``, ``SlurmSettings``), else the comment
  above the key in the packaged demo config (``broker/demo.toml``).
* ``reference/grpc.md``: the services, RPCs, messages, fields and enums of
  ``protos/bursar/v1/*.proto``, each with its leading comment.

The functions are pure (text in, Markdown out) so that ``tests/project/test_docs_site.py`` can
call them without a build. The CLI reference is ``reference/cli.md`` (mkdocs-click).
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos" / "bursar" / "v1"
CONFIG_PAGE = "reference/configuration.md"
GRPC_PAGE = "reference/grpc.md"


# ---------------------------------------------------------------------------------------
# Configuration reference


@dataclass(frozen=True)
class Key:
    """One key of a config file, as the reference lists it."""

    path: str  # dotted, with placeholders for names the operator picks: campaigns.NAME.gpu
    type: str
    default: str
    allowed: str
    description: str


def _attribute_docs(cls: type) -> dict[str, str]:
    """A dataclass's attribute docstrings (the string literal after each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = " ".join(after.value.value.split())
    return out


_TOML_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=")
_TOML_TABLE = re.compile(r"^\[([^\]]+)\]")
_CAMPAIGN_KEY_DOC = re.compile(r"^#\s{2,}([a-z_]+)\s{2,}(.+)$")
_COMMENTED_KEY = re.compile(r"^#\s*([a-z_]+)\s*=\s*[^#]+#\s*(.+)$")


def demo_comments(text: str) -> dict[str, str]:
    """Comments above keys in the packaged demo config, by dotted key with the names the
    operator picks replaced as the reference writes them (``pool.groups.NAME.count``).

    The demo's header for campaigns lists the campaign and envelope keys as
    ``#   key   text`` lines; those become ``campaigns.NAME.key`` and
    ``campaigns.NAME.DIM.key``."""
    out: dict[str, str] = {}
    table = ""
    comment: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        m = _CAMPAIGN_KEY_DOC.match(line)
        if m:
            key, doc = m.groups()
            where = "campaigns.NAME" if key in ("class", "preemptible") else "campaigns.NAME.DIM"
            out.setdefault(f"{where}.{key}", doc.strip())
            continue
        c = _COMMENTED_KEY.match(line)
        if c:
            # A key shown commented out, with its note: "# prefix = "node"   # optional; ..."
            out.setdefault(f"{table}.{c.group(1)}" if table else c.group(1), c.group(2).strip())
            continue
        if line.startswith("#"):
            text_ = line.lstrip("#").strip()
            if text_ and not set(text_) <= {"-"}:
                comment.append(text_)
            continue
        t = _TOML_TABLE.match(line)
        k = _TOML_KEY.match(line)
        if t:
            table = _generic_table(t.group(1))
            if comment:
                out.setdefault(table, " ".join(comment))
        elif k and comment:
            out.setdefault(f"{table}.{k.group(1)}" if table else k.group(1), _general(comment))
        if line:
            comment = []
    return out


def _general(comment: list[str]) -> str:
    """A demo comment without the sentences that work out the demo's own numbers
    ("26 nodes = 208 GPUs: ..."), which describe the demo, not the key."""
    sentences = re.split(r"(?<=\.) ", " ".join(comment))
    return " ".join(s for s in sentences if " = " not in s)


def _generic_table(name: str) -> str:
    parts = name.split(".")
    if parts[:2] == ["pool", "groups"] and len(parts) > 2:
        return "pool.groups.NAME"
    if parts[0] == "campaigns" and len(parts) > 1:
        return ".".join(["campaigns", "NAME", *(["DIM"] if len(parts) > 2 else [])])
    return name


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return "string"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "string"
    return {float: "number", int: "integer", bool: "boolean", str: "string"}.get(tp, "table")


def _allowed(info: Any, tp: Any, special: str | None) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Literal or not args:
        args = [tp]
    values: list[str] = []
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            values += [f'`"{v}"`' for v in typing.get_args(a)]
        elif isinstance(a, type) and issubclass(a, enum.Enum):
            values += [f'`"{m.value}"`' for m in a]
        elif a is bool:
            values += ["`true`", "`false`"]
    bounds = []
    for m in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                bounds.append(f"{sign} {v}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            bounds.append(f"matching `{pattern}`")
        min_length = getattr(m, "min_length", None)
        if min_length:
            bounds.append(f"at least {min_length} entry")
    if special:
        values.append(f'`"{special}"`')
    return ", ".join(values + bounds) or "any"


def _default(info: Any) -> str:
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        return "(empty table)"
    d = info.default
    if d is PydanticUndefined:
        return "required"
    if d is None:
        return "unset"
    if isinstance(d, enum.Enum):
        d = d.value
    if isinstance(d, bool):
        return f"`{str(d).lower()}`"
    if isinstance(d, str):
        return f'`"{d}"`'
    if isinstance(d, float) and d.is_integer():
        return f"`{int(d)}`"
    return f"`{d}`"


def config_keys() -> list[Key]:
    """Every key of a config file, walked from the pydantic schema in broker/config.py."""
    from pydantic import BaseModel

    from bursar.broker import config as cfg
    from bursar.broker import dims, policy

    from_toml = demo_comments((ROOT / "broker" / "demo.toml").read_text(encoding="utf-8"))
    docs = {
        "": _attribute_docs(cfg.Config),
        "policy": _attribute_docs(policy.PolicySpec),
        "pool": _attribute_docs(policy.PoolSpec),
        "pool.groups.NAME": _attribute_docs(policy.NodeGroup),
        "slurm": _attribute_docs(cfg.SlurmSettings),
    }
    # The strings a key takes besides its type (its validators turn them into None).
    special = {"policy.fairshare_half_life_s": "off", "campaigns.NAME.DIM.bucket": "unlimited"}
    # The Slurm backend's file replaces [pool] by a pool without groups: its keys are the
    # same as the simulated pool's, less groups, so one walk over _File and [slurm] covers
    # both files.
    out: list[Key] = []

    def walk(prefix: str, model: type[BaseModel]) -> Iterator[Key]:
        for name, info in model.model_fields.items():
            key = info.alias or name
            path = f"{prefix}.{key}" if prefix else key
            tp = info.annotation
            inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
            sub = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if typing.get_origin(tp) is dict:
                value = typing.get_args(tp)[1]
                placeholder = "NAME"
                yield Key(
                    path,
                    "table of tables",
                    _default(info),
                    _allowed(info, tp, None),
                    _describe(path, docs, from_toml, info),
                )
                yield from walk(f"{path}.{placeholder}", value)
                continue
            if sub is not None and path.startswith("campaigns.NAME.") and key in dims.ENVELOPED:
                # The dimension tables share one envelope: listed once, as DIM (power in
                # watts, its bucket in joules).
                if key != dims.ENVELOPED[0]:
                    continue
                path = "campaigns.NAME.DIM"
                yield Key(
                    path,
                    "table",
                    "unset",
                    ", ".join(f"`{d}`" for d in dims.ENVELOPED),
                    "An envelope in one dimension (DIM is one of the allowed names); "
                    "a missing table means no envelope in that dimension.",
                )
                yield from walk(path, sub)
                continue
            if sub is not None:
                if prefix:  # a top-level table is its section's heading, not a row
                    yield Key(
                        path,
                        "table",
                        _default(info),
                        "the keys below",
                        _describe(path, docs, from_toml, info),
                    )
                yield from walk(path, sub)
                continue
            yield Key(
                path,
                _type_name(tp),
                _default(info),
                _allowed(info, tp, special.get(path)),
                _describe(path, docs, from_toml, info),
            )

    out.extend(walk("", cfg._File))
    return out


def _describe(path: str, docs: dict[str, dict[str, str]], toml: dict[str, str], info: Any) -> str:
    if info.description:
        return str(info.description)
    table, _, key = path.rpartition(".")
    if key in docs.get(table, {}):
        return docs[table][key]
    if path in toml:
        return toml[path]
    from bursar.broker import dims

    if key in dims.ALL:
        # A dimension's entry in a per-dimension table: the table's documentation, else
        # what the demo says of a sibling dimension (it comments the table's first key).
        parent, _, name = table.rpartition(".")
        sibling = next((toml[f"{table}.{d}"] for d in dims.ALL if f"{table}.{d}" in toml), None)
        shared = docs.get(parent, {}).get(name) or sibling or toml.get(table, "")
        return f"In `{key}`. {shared}".strip()
    return toml.get(path, "")


def config_reference() -> str:
    """The configuration reference page."""
    # The top-level keys first (a file's first lines), then each table in schema order.
    keys = sorted(config_keys(), key=lambda k: "." in k.path or k.type.startswith("table"))
    lines = [
        "# Configuration reference",
        "",
        "Generated from the schema in `broker/config.py` at every build of this site. A config",
        "file is TOML (`.toml`) or YAML (`.yaml`, `.yml`) with these keys; unknown keys are",
        "errors. `NAME` is a name you choose (a node group, a campaign), `DIM` a dimension.",
        "Under `bursar serve --backend slurm` the nodes come from Slurm: `[pool]` then has no",
        "`groups`, and `[slurm]` applies. How to write and check a file:",
        "[Configuration](../operators/configuration.md).",
        "",
    ]
    section = None
    for k in keys:
        top = k.path.split(".")[0] if "." in k.path or k.type.startswith("table") else ""
        if top != section:
            section = top
            title = f"`[{top}]`" if top else "Top level"
            lines += [
                "",
                f"## {title}",
                "",
                "| key | type | default | allowed | description |",
                "|---|---|---|---|---|",
            ]
        desc = k.description.replace("|", "\\|") or " "
        allowed = k.allowed.replace("|", "\\|")
        lines.append(f"| `{k.path}` | {k.type} | {k.default} | {allowed} | {desc} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# gRPC reference


@dataclass
class ProtoField:
    name: str
    type: str
    number: str
    comment: str
    oneof: str | None = None


@dataclass
class ProtoRpc:
    name: str
    request: str
    response: str
    comment: str


@dataclass
class ProtoBlock:
    """A service, message or enum, with what it holds."""

    kind: str  # service, message, enum
    name: str  # qualified for nested ones: WhatIfResponse.Kind
    comment: str
    fields: list[ProtoField] = field(default_factory=list)
    rpcs: list[ProtoRpc] = field(default_factory=list)


@dataclass
class ProtoFile:
    name: str
    comment: str
    blocks: list[ProtoBlock] = field(default_factory=list)


_BLOCK = re.compile(r"^(service|message|enum|oneof)\s+(\w+)\s*\{")
_RPC = re.compile(
    r"^rpc\s+(\w+)\s*\(\s*(stream\s+)?([\w.]+)\s*\)\s*returns\s*\(\s*(stream\s+)?([\w.]+)\s*\)"
)
_FIELD = re.compile(r"^((?:optional|repeated)\s+)?(map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*(\d+)")
_ENUM_VALUE = re.compile(r"^(\w+)\s*=\s*(-?\d+)")


def parse_proto(text: str, name: str) -> ProtoFile:
    """The services, RPCs, messages, fields and enums of a .proto file with their leading
    comments (the ``//`` lines right above each). A small parser for the subset the
    contract uses: nested messages and enums, oneof, maps, options and reserved lines."""
    lines = text.splitlines()
    # The file's comment: its first comment block.
    head: list[str] = []
    for line in lines:
        if not line.startswith("//"):
            break
        head.append(line[3:] if line.startswith("// ") else line[2:])
    out = ProtoFile(name, "\n".join(head).strip())
    stack: list[ProtoBlock | str] = []  # open blocks; a oneof is its name
    comment: list[str] = []
    for raw in lines[len(head) :]:
        line = raw.strip()
        if line.startswith("//"):
            text_ = line[2:]
            comment.append(text_[1:] if text_.startswith(" ") else text_)
            continue
        doc = _join_comment(comment)
        if not line:
            comment = []
            continue
        comment = []
        m = _BLOCK.match(line)
        if m:
            kind, bname = m.groups()
            if kind == "oneof":
                stack.append(bname)
                continue
            parent = next((b for b in reversed(stack) if isinstance(b, ProtoBlock)), None)
            qual = f"{parent.name}.{bname}" if parent else bname
            block = ProtoBlock(kind, qual, doc)
            out.blocks.append(block)
            if not line.endswith("}"):  # "message Empty {}" opens and closes on one line
                stack.append(block)
            continue
        if line.startswith("}"):
            if stack:
                stack.pop()
            continue
        current = next((b for b in reversed(stack) if isinstance(b, ProtoBlock)), None)
        oneof = stack[-1] if stack and isinstance(stack[-1], str) else None
        if current is None or line.startswith(("reserved ", "option ", "syntax ", "package ")):
            continue
        if current.kind == "service":
            r = _RPC.match(line)
            if r:
                req = ("stream " if r.group(2) else "") + r.group(3)
                resp = ("stream " if r.group(4) else "") + r.group(5)
                current.rpcs.append(ProtoRpc(r.group(1), req, resp, doc))
            continue
        if current.kind == "enum":
            e = _ENUM_VALUE.match(line)
            if e:
                current.fields.append(ProtoField(e.group(1), "", e.group(2), doc))
            continue
        f = _FIELD.match(line)
        if f:
            label = (f.group(1) or "").strip()
            ftype = f"{label} {f.group(2)}".strip()
            current.fields.append(ProtoField(f.group(3), ftype, f.group(4), doc, oneof))
    return out


def _join_comment(lines: list[str]) -> str:
    return "\n".join(lines).strip()


def _cell(text: str) -> str:
    """A comment as one table cell: paragraphs joined, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|") or " "


def _anchor(name: str) -> str:
    return name.lower().replace(".", "")


def grpc_reference(files: list[ProtoFile]) -> str:
    """The gRPC reference page."""
    known = {b.name for f in files for b in f.blocks}

    def link(tp: str) -> str:
        stream = tp.startswith("stream ")
        base = tp.removeprefix("stream ")
        label = next((w for w in ("optional ", "repeated ") if base.startswith(w)), "")
        base = base.removeprefix(label)
        shown = f"[`{base}`](#{_anchor(base)})" if base in known else f"`{base}`"
        return ("stream " if stream else "") + label + shown

    lines = [
        "# gRPC reference",
        "",
        "Generated from the comments in `protos/bursar/v1/*.proto` at every build of this site",
        "(package `bursar.v1`). How to call it from any language: [Agents over",
        "gRPC](../guides/grpc.md).",
        "",
    ]
    for f in files:
        lines += [f"## `{f.name}`", "", "```text", f.comment, "```", ""]
        for b in f.blocks:
            lines += [f"### {b.name}", "", f"*{b.kind}*", ""]
            if b.comment:
                lines += [_fence_diagrams(b.comment), ""]
            if b.rpcs:
                lines += ["| rpc | request | response | description |", "|---|---|---|---|"]
                lines += [
                    f"| `{r.name}` | {link(r.request)} | {link(r.response)} | {_cell(r.comment)} |"
                    for r in b.rpcs
                ]
                lines.append("")
            if b.fields and b.kind == "enum":
                lines += ["| value | number | description |", "|---|---:|---|"]
                lines += [f"| `{x.name}` | {x.number} | {_cell(x.comment)} |" for x in b.fields]
                lines.append("")
            elif b.fields:
                lines += ["| field | type | number | description |", "|---|---|---:|---|"]
                for x in b.fields:
                    note = f"(oneof `{x.oneof}`) " if x.oneof else ""
                    lines.append(
                        f"| `{x.name}` | {link(x.type)} | {x.number} | {note}{_cell(x.comment)} |"
                    )
                lines.append("")
    return "\n".join(lines) + "\n"


def _fence_diagrams(text: str) -> str:
    """A comment's indented lines (state diagrams, lists) kept as they are in a fence."""
    out: list[str] = []
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("  ") and line.strip():
            block.append(line)
            continue
        if block:
            out += ["", "```text", *block, "```", ""]
            block = []
        out.append(line)
    return "\n".join(out).strip()


def proto_files() -> list[ProtoFile]:
    return [
        parse_proto(p.read_text(encoding="utf-8"), p.name)
        for p in sorted(PROTO_DIR.glob("*.proto"), key=lambda p: (p.name != "broker.proto", p))
    ]


# ---------------------------------------------------------------------------------------
# Rules versions

RULES_MARKER = "<!-- rules-versions -->"
_VERSION_START = re.compile(r"(?:^|(?<=[.)] ))(\d+): ")


def rules_versions(source: str) -> list[tuple[int, str]]:
    """What each engine rules version changed, from the documentation of ``RULES_VERSION``
    in ``broker/rules_version.py`` (its text lists them as "2: ... 3: ...")."""
    tree = ast.parse(source)
    doc = ""
    for node, after in itertools.pairwise(tree.body):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if (
            any(isinstance(x, ast.Name) and x.id == "RULES_VERSION" for x in targets)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            doc = " ".join(str(after.value.value).split())
    parts = _VERSION_START.split(doc)
    # parts: [preamble, "2", text, "3", text, ...]
    return [(int(n), text.strip()) for n, text in zip(parts[1::2], parts[2::2], strict=True)]


def rules_versions_markdown() -> str:
    source = (ROOT / "broker" / "rules_version.py").read_text(encoding="utf-8")
    rows = ["| version | what changed |", "|---:|---|"]
    rows += [f"| {n} | {_cell(text)} |" for n, text in rules_versions(source)]
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------
# The MkDocs hook


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, CONFIG_PAGE, content=config_reference()))
    files.append(File.generated(config, GRPC_PAGE, content=grpc_reference(proto_files())))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if RULES_MARKER in markdown:
        return markdown.replace(RULES_MARKER, rules_versions_markdown())
    return markdown


__all__ = [
    "config_keys",
    "config_reference",
    "demo_comments",
    "grpc_reference",
    "on_files",
    "on_page_markdown",
    "parse_proto",
    "proto_files",
    "rules_versions",
]
