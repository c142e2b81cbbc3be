"""The run manifest: enough to tell whether two replays are the same run.

Input hash (the trace file's bytes), policy and config hash, seed, versions, and the
hashes of what the run wrote. Nothing in it depends on the wall clock or the machine's
paths, so the same input gives the same manifest, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from bursar.broker.errors import DISTRIBUTION

MANIFEST_VERSION = 1


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical(data: Any) -> bytes:
    """JSON with sorted keys and no whitespace variation: the bytes that get hashed."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    return {
        "bursar": _version(DISTRIBUTION),
        "python": platform.python_version(),
        "sortedcontainers": _version("sortedcontainers"),
    }


def build_manifest(
    *,
    trace: str | Path,
    trace_sha256: str,
    policy: str,
    config: dict[str, Any],
    seed: int,
    outputs: dict[str, str],
    plugin: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``plugin``: where a plug-in policy came from (its distribution, version and entry
    point); absent for a built-in, whose manifests stay as they were."""
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "input": {"trace": Path(trace).name, "sha256": trace_sha256},
        "policy": policy,
        "config": config,
        "config_sha256": sha256(canonical(config)),
        "seed": seed,
        "versions": versions(),
        "outputs": dict(sorted(outputs.items())),
    }
    if plugin is not None:
        manifest["plugin"] = dict(sorted(plugin.items()))
    return manifest
