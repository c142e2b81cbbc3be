#!/usr/bin/env bash
# Installs the Debian packages that parts of the test suite need (headless Chromium for the
# report-rendering test, Slurm and munge for the Slurm backend tests, slurmdbd and MariaDB for
# the sacct round trip (scripts/slurm-cluster.sh start --accounting), a C compiler for the
# journal's slow-disk test, promtool for the metrics lint), if any is missing.
#
# Idempotent and quick when everything is present. Needs root and apt-get; without them it
# says what to install and exits 0, and the tests that need a missing package skip, unless
# BURSAR_REQUIRE_SYSTEM_TESTS=1 (set by .ci/run), in which case they fail.
set -euo pipefail

# file that proves the package is installed (a binary, or a header) -> Debian package
declare -A wanted=(
  [/usr/bin/chromium]=chromium
  [/usr/sbin/slurmctld]=slurmctld
  [/usr/sbin/slurmd]=slurmd
  [/usr/bin/squeue]=slurm-client
  [/usr/sbin/munged]=munge
  [/usr/sbin/slurmdbd]=slurmdbd
  [/usr/bin/mariadbd-safe]=mariadb-server # its own file; it brings mariadbd and the client
  [/usr/bin/gcc]=gcc
  [/usr/include/dlfcn.h]=libc6-dev
  [/usr/bin/promtool]=prometheus
  [/usr/lib/postgresql/15/bin/postgres]=postgresql # the PostgreSQL journal tests
)

missing=()
for bin in "${!wanted[@]}"; do
  [[ -e "$bin" ]] || missing+=("${wanted[$bin]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "system-deps: missing Debian packages: ${missing[*]}" >&2
  echo "system-deps: install them as root (apt-get install ${missing[*]}); until then the" >&2
  echo "system-deps: tests that need them are skipped" >&2
  if [[ "${BURSAR_REQUIRE_SYSTEM_TESTS:-0}" == 1 ]]; then
    exit 1
  fi
  exit 0
fi

echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# The tests start every daemon they need themselves (privately, under their own directories):
# keep the packages' maintainer scripts from starting system-wide ones (a MariaDB on port
# 3306, a slurmctld on the default config) by the standard policy-rc.d veto, where the
# image has none of its own, and only for the time of the install.
veto=""
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  veto=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' >"$veto"
  chmod 755 "$veto"
  trap 'rm -f "$veto"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
