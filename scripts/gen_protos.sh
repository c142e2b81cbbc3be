#!/usr/bin/env bash
# Regenerate the Python modules of the wire contract (protos/bursar/v1/*.proto) in place.
# Run from anywhere; uses the repository's .venv unless PYTHON is set. Pass --check to
# only verify that the committed files are up to date.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${PYTHON:-$root/.venv/bin/python}" -m bursar.protos.gen "$@"
