"""The documentation site builds strictly, and its generated references cover the source.

The site (mkdocs.yml, docs/) is built once, with ``mkdocs build --strict`` as ``make docs``
runs it, into a temporary folder: a broken link or anchor, or a page left out of the nav,
fails the build. The generated reference pages are then checked against the source by
walks of their own: every config key of the pydantic schema (and of the packaged demo
config), every ``bursar`` command and option (click), and every service, RPC, message,
field and enum value of the wire contract (the compiled descriptors, not the .proto text
the generator parses).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent.parent


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    res = _build(ROOT / "mkdocs.yml", out)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _text(page: Path) -> str:
    """A built page's text, tags dropped (code highlighting splits a line into spans),
    entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_the_strict_build_fails_on_a_broken_link_and_a_page_missing_from_nav(
    tmp_path: Path,
) -> None:
    # The site's own validation settings on a two-page site: one page links nowhere, the
    # other is not in the nav. Both must stop the build, or the build above proves nothing.
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    small = {"site_name": "t", "strict": True, "validation": cfg["validation"], "nav": ["index.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    res = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    assert "missing.md" in res.stderr and "orphan.md" in res.stderr, res.stderr


def test_the_site_builds_with_every_page_in_the_nav(site: Path) -> None:
    for page in (
        "index.html",
        "reference/configuration/index.html",
        "reference/cli/index.html",
        "reference/grpc/index.html",
        "getting-started/index.html",
        "results/index.html",
    ):
        assert (site / page).is_file(), page
    # The README's first hour is included in Getting started, not written twice.
    assert "bursar acquire --size gpu=8 --duration 600" in _text(
        site / "getting-started" / "index.html"
    )


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    text = "\n".join(lines)
    assert text.index("make demo") < text.index("make test")
    assert "docs/dashboard.png" in text
    # Its links into the docs are files that exist (the site's strict build checks the
    # pages' own links; the README is not one of them).
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the docs"
    broken = [t for t in local if not (ROOT / t).exists()]
    assert not broken, f"README.md links to missing files: {broken}"


def test_every_results_page_gives_its_command_and_date() -> None:
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        if page.name == "index.md":
            continue
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name}: no date"
        assert re.search(r"`(make |bursar |\.venv/bin/python |python )", text), page.name


# ---------------------------------------------------------------------------------------
# The configuration reference


def _schema_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    from bursar.broker import dims

    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}.{key}" if prefix else key
        args = [a for a in typing.get_args(info.annotation) if a is not type(None)]
        if typing.get_origin(info.annotation) is dict:
            yield path
            yield from _schema_keys(args[1], f"{path}.NAME")
            continue
        sub = next(
            (
                a
                for a in [info.annotation, *args]
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if prefix.startswith("campaigns.NAME") and key in dims.ENVELOPED:
            path = "campaigns.NAME.DIM"
        yield path
        if sub is not None:
            yield from _schema_keys(sub, path)


def _demo_keys(table: dict[str, object], prefix: str = "") -> Iterator[str]:
    from bursar.broker import dims

    for key, value in table.items():
        if prefix in ("pool.groups", "campaigns"):
            path = f"{prefix}.NAME"
        elif prefix.startswith("campaigns.NAME") and key in dims.ENVELOPED:
            path = f"{prefix}.DIM"
        else:
            path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            yield from _demo_keys(value, path)
        else:
            yield path


def test_the_configuration_reference_lists_every_key(site: Path) -> None:
    from bursar.broker import config

    page = (site / "reference" / "configuration" / "index.html").read_text()
    rows = {
        html.unescape(m.group(1)): html.unescape(m.group(2))
        for m in re.finditer(r"<tr>\s*<td><code>([^<]+)</code></td>(.*?)</tr>", page, re.S)
    }
    schema = set(_schema_keys(config._File)) | {f"slurm.{k}" for k in config._Slurm.model_fields}
    demo = tomllib.loads((ROOT / "broker" / "demo.toml").read_text())
    wanted = (schema - {"pool", "policy", "slurm"}) | set(_demo_keys(demo))
    missing = sorted(k for k in wanted if k not in rows)
    assert not missing, f"not in the configuration reference: {missing}"
    # Each row gives a type and a default; the policy's keys, whose meaning the engine's
    # spec documents, each have a description.
    for key in (k for k in rows if k.startswith("policy.") and k.count(".") == 1):
        cells = re.findall(r"<td>(.*?)</td>", rows[key], re.S)
        assert len(cells) == 4 and all(c.strip() for c in cells), (key, cells)


# ---------------------------------------------------------------------------------------
# The command-line reference


def _commands(
    cmd: click.Command, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, cmd
    if isinstance(cmd, click.Group):
        # Through the group's own look-up: the top-level group loads its commands lazily.
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, (*path, name))


def test_the_cli_reference_covers_every_command_and_option(site: Path) -> None:
    from bursar.cli.main import main

    page = (site / "reference" / "cli" / "index.html").read_text()
    text = _text(site / "reference" / "cli" / "index.html")
    # click 8.3's placeholder for "no default" must not leak into the page as a value.
    assert "Sentinel" not in text
    for path, cmd in _commands(main, ("bursar",)):
        anchor = "-".join(path)
        assert f'id="{anchor}"' in page, f"{' '.join(path)}: no section in the CLI reference"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                name = max(param.opts, key=len)
                assert name in text, f"{' '.join(path)} {name}: not in the CLI reference"


# ---------------------------------------------------------------------------------------
# The gRPC reference


def test_the_grpc_reference_covers_every_rpc_message_and_field(site: Path) -> None:
    from bursar.protos.bursar.v1 import admin_pb2, broker_pb2

    page = (site / "reference" / "grpc" / "index.html").read_text()
    text = _text(site / "reference" / "grpc" / "index.html")

    def messages(descs: object, outer: str = "") -> Iterator[tuple[str, object]]:
        for d in descs:  # type: ignore[attr-defined]
            name = f"{outer}.{d.name}" if outer else d.name
            yield name, d
            yield from messages(d.nested_types, name)

    for module in (broker_pb2, admin_pb2):
        fd = module.DESCRIPTOR
        for service in fd.services_by_name.values():
            assert f'id="{service.name.lower()}"' in page, service.name
            for method in service.methods:
                row = re.search(rf"<td><code>{method.name}</code></td>(.*?)</tr>", page, re.S)
                assert row, f"{service.name}.{method.name}: not in the gRPC reference"
                cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
                assert cells[-1].strip(), f"{service.name}.{method.name}: no description"
        for name, msg in messages(fd.message_types_by_name.values()):
            if msg.GetOptions().map_entry:  # type: ignore[attr-defined]
                continue
            assert f'id="{name.lower().replace(".", "")}"' in page, f"message {name}"
            for f in msg.fields:  # type: ignore[attr-defined]
                assert f"{f.name}" in text, f"{name}.{f.name}"
        enums = list(fd.enum_types_by_name.values())
        for _, msg in messages(fd.message_types_by_name.values()):
            enums += list(msg.enum_types)  # type: ignore[attr-defined]
        for enum in enums:
            for value in enum.values:
                assert value.name in text, f"{enum.name}.{value.name}"
