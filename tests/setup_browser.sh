#!/usr/bin/env bash
# The dashboard's browser tests (tests/test_dashboard.py) drive Debian's Chromium through
# Playwright for Python (the dev extra); Playwright's own browser download is never used.
# Idempotent: installs the chromium package only when no Chromium is found.
set -euo pipefail
for candidate in "${RAYDOCK_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then
    echo "chromium: $candidate"
    exit 0
  fi
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
echo "chromium: $(command -v chromium)"
