"""``bursar traces list`` and ``bursar traces fetch`` against a real HTTP server on loopback
(``http.server`` in a thread) that serves a traces folder, as a site mirror would: a good
fetch, a checksum mismatch, an unknown name and unreachable or missing files, each leaving
nothing behind but what was checked. No test reaches the internet.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import tarfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from bursar.cli.main import main
from bursar.sim.replay.catalog import CATALOG, Entry, TraceFile, entry, verify, with_needs
from bursar.sim.replay.fetch import FetchError, fetch

SHARED = Path(
    os.environ.get("BURSAR_TRACES_DIR") or Path(__file__).resolve().parents[3] / "shared" / "traces"
)
KTH = entry("kth-sp2").files[0]


def needs_shared() -> None:
    if not (SHARED / KTH.path).is_file():
        pytest.skip(f"no traces at {SHARED} (set BURSAR_TRACES_DIR)")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(folder)`` starts a loopback HTTP server on ``folder`` and returns its URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(folder: Path) -> str:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def bursar(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_the_catalogue_pins_the_shared_copies() -> None:
    # The shared folder holds each file as published (the ElasticFlow tables gzipped from
    # the archive's members): every pin must match it, or a real fetch would be refused.
    needs_shared()
    for e in CATALOG.values():
        for f in e.files:
            data = (SHARED / f.path).read_bytes()
            assert verify(f, data) is None, (e.name, f.path)
            if f.member is None:
                assert len(data) == f.size, (e.name, f.path)


def test_every_entry_is_whole() -> None:
    for name, e in CATALOG.items():
        assert e.name == name
        assert (e.packaged is None) == bool(e.files), name
        assert all(n in CATALOG for n in e.needs), name
        assert e.licence and e.attribution, name
        for f in e.files:
            assert len(f.sha256) == 64 and f.url.startswith("https://"), (name, f.path)
            assert (f.member is None) == (f.member_sha256 is None), (name, f.path)
    # An ElasticFlow table brings the curves `bursar sim elastic` reads beside it.
    assert [e.name for e in with_needs(["cluster05", "195job"])] == [
        "cluster05",
        "throughputs-a100",
        "195job",
    ]


def test_fetch_writes_the_checked_file_where_the_commands_look(tmp_path: Path, serve: Any) -> None:
    needs_shared()
    mirror = tmp_path / "mirror"
    (mirror / KTH.path).parent.mkdir(parents=True)
    shutil.copyfile(SHARED / KTH.path, mirror / KTH.path)
    url = serve(mirror)
    dest = tmp_path / "traces"
    r = bursar("traces", "fetch", "kth-sp2", "--to", str(dest), "--from", url)
    assert r.exit_code == 0, r.output
    got = dest / KTH.path
    assert f"kth-sp2: fetched: {got}" in r.output
    assert hashlib.sha256(got.read_bytes()).hexdigest() == KTH.sha256
    assert _files(dest) == [got]  # no partial download left beside it
    # Listed as fetched, and found by name by the replay commands.
    r = bursar("traces", "list", "--traces", str(dest), "--json")
    assert {e["name"]: e["local"] for e in json.loads(r.output)}["kth-sp2"] == str(got)
    out = tmp_path / "run"
    r = bursar(
        "replay",
        *("--trace", "kth-sp2", "--traces", str(dest), "--policy", "easy"),
        *("--limit", "500", "--out", str(out)),
    )
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["sha256"] == KTH.sha256, manifest["input"]
    # A second fetch finds it intact and downloads nothing.
    r = bursar("traces", "fetch", "kth-sp2", "--to", str(dest), "--from", url + "/nothing")
    assert r.exit_code == 0, r.output
    assert "kth-sp2: already there" in r.output


def test_an_elasticflow_table_comes_with_its_curves_and_licence(tmp_path: Path, serve: Any) -> None:
    needs_shared()
    url = serve(SHARED)
    dest = tmp_path / "traces"
    r = bursar("traces", "fetch", "195job", "--to", str(dest), "--from", url)
    assert r.exit_code == 0, r.output
    itp = dest / "elasticflow-itp"
    assert gzip.decompress((itp / "195job.csv.gz").read_bytes()) == gzip.decompress(
        (SHARED / "elasticflow-itp" / "195job.csv.gz").read_bytes()
    )
    assert (itp / "LICENSE-elasticflow-traces-MIT").read_text().startswith("    MIT License")
    curves = sorted(p.name for p in (itp / "throughputs_A100").iterdir())
    assert curves == sorted(p.name for p in (SHARED / "elasticflow-itp/throughputs_A100").iterdir())
    # What was fetched is what the elastic simulation reads.
    r = bursar(
        "sim",
        "elastic",
        *("--trace", str(itp / "195job.csv.gz"), "--quick", "--policy", "fixed"),
        *("--out", str(tmp_path / "elastic")),
    )
    assert r.exit_code == 0, r.output


def test_a_checksum_mismatch_is_refused_and_writes_nothing(tmp_path: Path, serve: Any) -> None:
    mirror = tmp_path / "mirror"
    (mirror / KTH.path).parent.mkdir(parents=True)
    (mirror / KTH.path).write_bytes(gzip.compress(b"; not the KTH-SP2 log\n", mtime=0))
    dest = tmp_path / "traces"
    r = bursar("traces", "fetch", "kth-sp2", "--to", str(dest), "--from", serve(mirror))
    assert r.exit_code == 1
    assert f"not the published {KTH.path}: SHA-256 " in r.output
    assert f"expected {KTH.sha256}; nothing was written" in r.output
    assert not dest.exists()


def test_an_unknown_name_is_refused_with_the_names(tmp_path: Path) -> None:
    r = bursar("traces", "fetch", "kth-sp3", "--to", str(tmp_path / "traces"))
    assert r.exit_code == 2
    assert "no trace called 'kth-sp3' in the catalogue" in r.output
    for name in ("sample", "ctc-sp2", "sdsc-sp2", "hpc2n", "kth-sp2", "cluster05"):
        assert name in r.output
    assert not (tmp_path / "traces").exists()
    r = bursar("traces", "fetch")
    assert r.exit_code == 2 and "name a trace or give --all" in r.output


def test_a_network_error_is_a_clear_error_and_writes_nothing(tmp_path: Path, serve: Any) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = tmp_path / "traces"
    r = bursar(
        "traces", "fetch", "kth-sp2", "--to", str(dest), "--from", f"http://127.0.0.1:{port}"
    )
    assert r.exit_code == 1
    assert f"cannot download http://127.0.0.1:{port}/{KTH.path}: " in r.output
    assert "refused" in r.output.lower()
    assert "--from URL_BASE" not in r.output  # the hint is for the published address only
    # A mirror that lacks the file: the server's answer, named.
    r = bursar("traces", "fetch", "kth-sp2", "--to", str(dest), "--from", serve(tmp_path))
    assert r.exit_code == 1 and "HTTP 404" in r.output
    assert not dest.exists()


def _archive(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_member_is_cut_from_the_checked_archive(tmp_path: Path, serve: Any) -> None:
    # The published path for the ElasticFlow tables: one archive download, checked, then
    # each member kept gzipped (as the tables are) or as it is (the licence).
    table, licence = b"job_id,submission_time\na,1\n", b"MIT License\n"
    archive = _archive({"t.csv": table, "LICENSE": licence})
    site = tmp_path / "site"
    site.mkdir()
    (site / "a.tar.gz").write_bytes(archive)
    url = serve(site) + "/a.tar.gz"
    common = {"url": url, "sha256": _sha(archive), "size": len(archive)}
    e = Entry(
        name="t",
        kind="elastic",
        title="t",
        licence="MIT",
        attribution="test",
        files=(
            TraceFile("x/t.csv.gz", member="t.csv", member_sha256=_sha(table), **common),
            TraceFile("x/LICENSE", member="LICENSE", member_sha256=_sha(licence), **common),
        ),
    )
    got = fetch([e], tmp_path / "traces")
    assert [(g.name, g.status) for g in got] == [("t", "fetched")]
    assert gzip.decompress((tmp_path / "traces/x/t.csv.gz").read_bytes()) == table
    assert (tmp_path / "traces/x/LICENSE").read_bytes() == licence
    # The same entry against a changed archive: refused before anything is cut from it.
    (site / "a.tar.gz").write_bytes(_archive({"t.csv": b"other\n", "LICENSE": licence}))
    with pytest.raises(FetchError, match=r"not the published file: SHA-256 .*nothing was written"):
        fetch([e], tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
