"""The public traces the guide uses: where each comes from, under which terms, and the
SHA-256 of the file as published, so that a download is checked before it is used.

Fetched traces are laid out under a traces folder as ``<folder>/<file>`` (for example
``pwa-kth-sp2/KTH-SP2-1996-2.1-cln.swf.gz``), the layout the project's own trace
collection uses, so one folder serves ``bursar replay``, ``bursar matrix`` and
``bursar sim elastic`` alike. One small slice, ``sample``, ships inside the package.

Pure data and pure functions: downloading is :mod:`bursar.sim.replay.fetch`.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

__all__ = [
    "CATALOG",
    "SAMPLE",
    "SAMPLE_JOBS",
    "SAMPLE_SOURCE",
    "Entry",
    "TraceFile",
    "UnknownTrace",
    "entry",
    "locate",
    "packaged_path",
    "verify",
    "with_needs",
]

Kind = Literal["swf", "elastic", "curves"]


class UnknownTrace(KeyError):
    """A name that is not in the catalogue; the message lists the names that are."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class TraceFile:
    """One file of a trace: where it goes under the traces folder, where it is published
    and what the published bytes hash to."""

    path: str
    """Under the traces folder, ``/``-separated."""
    url: str
    """The published file, or the archive that holds it (``member``)."""
    sha256: str
    """Of the bytes at ``url`` as published."""
    size: int
    """Bytes at ``url``."""
    member: str | None = None
    """The file's name inside the tar archive at ``url``; None when ``url`` is the file."""
    member_sha256: str | None = None
    """Of the member's bytes: what the stored file holds (gzipped when ``path`` ends
    ``.gz``), and what a copy from a mirror is checked against."""


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: Kind
    """``swf``: a job log for replay, fidelity, what-if and matrix; ``elastic``: an
    ElasticFlow job table for ``bursar sim elastic``; ``curves``: the throughput curves
    that table needs beside it."""
    title: str
    licence: str
    """In a few words; ``attribution`` says whom to cite."""
    attribution: str
    files: tuple[TraceFile, ...] = ()
    needs: tuple[str, ...] = ()
    """Entries fetched with this one (an ElasticFlow table needs its throughput curves)."""
    packaged: str | None = None
    """A file inside this package (relative to ``bursar.sim.replay``): nothing to fetch."""

    @property
    def size(self) -> int:
        """Bytes to download (an archive that holds several of its files counts once)."""
        return sum({f.url: f.size for f in self.files}.values())

    @property
    def main(self) -> str | None:
        """The path (under the traces folder) the commands read, if the entry has files."""
        return self.files[0].path if self.files else None


_PWA = "https://www.cs.huji.ac.il/labs/parallel/workload"
_PWA_CITE = (
    "D. G. Feitelson, D. Tsafrir, D. Krakov, Experience with using the Parallel Workloads "
    "Archive, JPDC 74(10):2967-2982, 2014"
)
_PWA_TERMS = "PWA: cite"

_EF_COMMIT = "277ed24d0e908c31a1c98145819e2e3853d8ac00"
_EF_ARCHIVE = (
    f"https://raw.githubusercontent.com/microsoft/elasticflow-traces/{_EF_COMMIT}"
    "/data/elasticflow-traces.tar.gz"
)
_EF_ARCHIVE_SHA = "e9c20b73de61d2702aef086aebc995cbc432affbd0f09969cf30879c5d1a83c4"
_EF_ARCHIVE_SIZE = 2_599_482
_EF_CITE = (
    "D. Gu et al., ElasticFlow: An Elastic Serverless Training Platform for Distributed "
    "Deep Learning, ASPLOS '23; Microsoft ITP cluster traces (microsoft/elasticflow-traces)"
)
_EF_LICENCE = TraceFile(
    "elasticflow-itp/LICENSE-elasticflow-traces-MIT",
    _EF_ARCHIVE,
    _EF_ARCHIVE_SHA,
    _EF_ARCHIVE_SIZE,
    member="LICENSE",
    member_sha256="9906940f61b1f0b533fa7d99baf55178b2808fbe113ea51dfbfad8572ccd5f2b",
)

_CURVES_COMMIT = "04a0109a6acdd7d89f4cb31b6a6a7a128bee6bb0"
_CURVES_BASE = (
    f"https://raw.githubusercontent.com/pkusys/ElasticFlow/{_CURVES_COMMIT}/ElasticFlow/scheduler"
)
_CURVES = {
    "A100": (
        ("bert", 296, "7a0a81e8570b2474d4cab330a93b20830228170bfea0c8a12319300b7cae9dc7"),
        ("deepspeech2", 284, "9971817f583d5dfe45d1409dd4db2976b5657bbb8964d1e929cdcb715d06743e"),
        ("gpt2", 303, "a461033925114e094d87532fa4e5242339d3ac79ac2f23e756d201d9dde6957a"),
        ("inception3", 302, "a0da7a84eeea61d4ffd07bd47d7ecda44d20e661f2d197033c65b5d0d9de32e9"),
        ("resnet50", 439, "d28dff1b5c85c76590686c8fdb1124c0001db421376e3a5627c1c94853096fd5"),
        (
            "resnet50_cifar10",
            282,
            "fd2778b32fd31e4dbdbb42bd77d3d0ebca761f758b0bbfed39416070c59d1f0e",
        ),
        ("vgg16", 433, "b536b3a532b26f2a60982a57282c58a0c4b7712958179a1c3ec1869851ea530d"),
    ),
    "T4": (
        ("bert", 179, "167d6080720a28c35dba312761aefaafbbed9a2ab6b073cb5bc63ff8055ba518"),
        ("cifar10", 302, "ddac86c6934f02d975f18e6c7e218d9a55ac2a43055cab16219902fed036f4a2"),
        ("deepspeech2", 304, "104bbec207bb8a5c8756b8bb93add3f75033bee79070c9f8f73ecb2d149b430d"),
        ("imagenet", 319, "e5d7d80c92046826f9e63aeeb3ae5d72ed076c75361f000248f3dccf75d4029b"),
        ("ncf", 170, "7018bb3767554bde917207136008897117cd9cdf43ecb4ec5d30070502593e30"),
        ("yolov3", 143, "2aa3a81977b0a4791aa913bbb090b2f2d205ea49cf70e62a797d942b0a42491d"),
    ),
}


def _pwa(
    name: str,
    folder: str,
    file: str,
    size: int,
    sha: str,
    title: str,
    ack: str,
    licence: str = _PWA_TERMS,
) -> Entry:
    return Entry(
        name=name,
        kind="swf",
        title=title,
        licence=licence,
        attribution=f"{_PWA_CITE}; log acknowledgement: {ack}",
        files=(TraceFile(f"pwa-{name}/{file}", f"{_PWA}/{folder}/{file}", sha, size),),
    )


def _elastic(name: str, member_sha: str, jobs: int, span: str) -> Entry:
    table = TraceFile(
        f"elasticflow-itp/{name}.csv.gz",
        _EF_ARCHIVE,
        _EF_ARCHIVE_SHA,
        _EF_ARCHIVE_SIZE,
        member=f"{name}.csv",
        member_sha256=member_sha,
    )
    return Entry(
        name=name,
        kind="elastic",
        title=f"ElasticFlow ITP {name}: {jobs:,} DL jobs with deadlines, {span}",
        # The licence file travels with every table: MIT asks for its notice in copies.
        licence="MIT",
        attribution=_EF_CITE,
        files=(table, _EF_LICENCE),
        needs=("throughputs-a100",),
    )


def _curves(gpu: str) -> Entry:
    return Entry(
        name=f"throughputs-{gpu.lower()}",
        kind="curves",
        title=f"ElasticFlow's measured {gpu} throughputs (the elastic simulation's curves)",
        licence="none: own use only",
        attribution="pkusys/ElasticFlow, ElasticFlow/scheduler/throughputs_" + gpu,
        files=tuple(
            TraceFile(
                f"elasticflow-itp/throughputs_{gpu}/{m}.csv",
                f"{_CURVES_BASE}/throughputs_{gpu}/{m}.csv",
                sha,
                size,
            )
            for m, size, sha in _CURVES[gpu]
        ),
    )


SAMPLE = "sample"
SAMPLE_SOURCE = "kth-sp2"
SAMPLE_JOBS = 10_000
SAMPLE_FILE = "data/kth-sp2-sample.swf.gz"

CATALOG: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            name=SAMPLE,
            kind="swf",
            title=f"the first {SAMPLE_JOBS:,} jobs of kth-sp2, shipped with bursar",
            licence=_PWA_TERMS,
            attribution=f"{_PWA_CITE}; log acknowledgement: Lars Malinowsky",
            packaged=SAMPLE_FILE,
        ),
        _pwa(
            "ctc-sp2",
            "l_ctc_sp2",
            "CTC-SP2-1996-3.1-cln.swf.gz",
            1_487_336,
            "9fa28ac16c4386fb81b72a91d8bd8888281df2948a9d912769d387c5ee285bb4",
            "Cornell Theory Center SP2: 77,222 jobs, 338 processors, 1996-97",
            "Dan Dwyer and Steve Hotovy",
        ),
        _pwa(
            "sdsc-sp2",
            "l_sdsc_sp2",
            "SDSC-SP2-1998-4.2-cln.swf.gz",
            1_205_570,
            "e03fe48be50c4ab04d6bb2285296d9c3399e9c1f27ee79b754ad32a14abd9bac",
            "San Diego Supercomputer Center SP2: 59,715 jobs, 128 processors, 1998-2000",
            "Victor Hazlewood",
            # The log's header carries the JOBLOG data usage agreement.
            licence="JOBLOG: research and education, keep the notice",
        ),
        _pwa(
            "hpc2n",
            "l_hpc2n",
            "HPC2N-2002-2.2-cln.swf.gz",
            2_997_773,
            "3c534857d6065cfd9cc35aac8d064c9c17172be7acf336de835006f43a626e64",
            "HPC2N Seth Linux cluster: 202,871 jobs, 240 processors, 2002-06",
            "Ake Sandgren",
        ),
        _pwa(
            "kth-sp2",
            "l_kth_sp2",
            "KTH-SP2-1996-2.1-cln.swf.gz",
            411_455,
            "3e152f201fd2e96808a735bced6ea6eb0bb07fdc447689cafb0750d87b264c0b",
            "KTH Stockholm SP2: 28,476 jobs, 100 processors, 1996-97",
            "Lars Malinowsky",
        ),
        _elastic(
            "195job",
            "80eb7ae03ba5b19cbe9aa7ee68cf93ee438495b48aa18e414c83bdd8a400e5fb",
            194,
            "48 h (the paper's testbed trace)",
        ),
        _elastic(
            "cluster01",
            "599c2b80cea7b3d4784cc058981cf5f1238ce999b2e3a49b04c579884b7de1fb",
            1_594,
            "810 h",
        ),
        _elastic(
            "cluster02",
            "40c46447fb4738b4d2bf7e94be6e627803eabe161260bb702338e0c3680de2e5",
            5_777,
            "1,434 h",
        ),
        _elastic(
            "cluster03",
            "c8ddeebae6a586b4c3d9f0de6b7ec3ee20505bbc14b2f31ce7562f6a7e40b83f",
            3_010,
            "1,184 h",
        ),
        _elastic(
            "cluster04",
            "b999cbdb8a773b58ff26dc9e982025a8096b8ee866a464cec1a7e1f222ce0572",
            15_801,
            "1,427 h",
        ),
        _elastic(
            "cluster05",
            "10be53b70dca805233da5fd8d66a6d6939f215dc3ceff1d277de6ef98d5761bd",
            3_628,
            "1,422 h",
        ),
        _curves("A100"),
        _curves("T4"),
    )
}


def entry(name: str) -> Entry:
    """The entry called ``name``; an unknown name raises :class:`UnknownTrace` listing the
    names there are."""
    try:
        return CATALOG[name]
    except KeyError:
        raise UnknownTrace(
            f"no trace called {name!r} in the catalogue; the names are: {', '.join(CATALOG)}"
        ) from None


def with_needs(names: Iterable[str]) -> list[Entry]:
    """The entries named and those they need, each once, in the order first named."""
    out: dict[str, Entry] = {}
    for name in names:
        e = entry(name)
        for n in (e.name, *e.needs):
            out.setdefault(n, entry(n))
    return list(out.values())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(f: TraceFile, stored: bytes) -> str | None:
    """Why ``stored`` (the bytes to keep at ``f.path``) is not the published file, or None
    when it is. A file cut from an archive is checked by its contents, gunzipped when it is
    kept gzipped, since a gzip's bytes depend on the compressor."""
    if f.member is None:
        got = _sha(stored)
        return None if got == f.sha256 else f"SHA-256 {got}, expected {f.sha256}"
    data = stored
    if f.path.endswith(".gz"):
        try:
            data = gzip.decompress(stored)
        except (OSError, EOFError, zlib.error) as e:
            return f"not gzip: {e}"
    got = _sha(data)
    return None if got == f.member_sha256 else f"SHA-256 {got}, expected {f.member_sha256}"


def packaged_path(e: Entry) -> Path:
    """Where the package holds ``e``'s shipped file (a real file: the package is installed
    from a wheel or a checkout, never imported from a zip)."""
    assert e.packaged is not None, e.name
    return Path(str(resources.files("bursar.sim.replay").joinpath(e.packaged)))


def locate(e: Entry, dirs: Sequence[Path]) -> Path | None:
    """The file the commands read for ``e``: the shipped one, else its main file under the
    first of ``dirs`` that has it; None when none has."""
    if e.packaged is not None:
        return packaged_path(e)
    main = e.main
    assert main is not None, e.name
    for d in dirs:
        p = d / main
        if p.is_file():
            return p
    return None
