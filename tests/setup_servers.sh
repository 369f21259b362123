#!/usr/bin/env bash
# Installs the servers the tests start themselves, from Debian's packages, when missing:
# PostgreSQL (the store, queue and retention tests start a throwaway one from its binaries,
# bench/harness/databases.py) and HAProxy (the proxy put in front of API replicas,
# bench/harness/proxy.py). Root uses apt-get directly, others sudo; without either it only
# says what to install, and those tests then fail saying the same.
set -euo pipefail
packages=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || packages+=(postgresql)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || packages+=(haproxy)
if [ ${#packages[@]} = 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "Not installed: ${packages[*]}: install Debian's packages of that name (without postgresql, set RAYDOCK_TEST_NO_POSTGRES=1; without haproxy its tests skip)" >&2
    exit 0
fi
"${as_root[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y --no-install-recommends "${packages[@]}"
