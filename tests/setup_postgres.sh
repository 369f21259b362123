#!/usr/bin/env bash
# Installs Debian's PostgreSQL server package when it is missing: the store, queue and
# retention tests start a throwaway server of their own from its binaries
# (bench/harness/databases.py). Root uses apt-get directly, others sudo; without either it only
# says what to install, and those tests then fail saying the same.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "PostgreSQL is not installed: install Debian's 'postgresql' package, or set RAYDOCK_TEST_NO_POSTGRES=1" >&2
    exit 0
fi
"${as_root[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y --no-install-recommends postgresql
