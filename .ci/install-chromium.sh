#!/usr/bin/env bash
# Install Debian's Chromium for the headless browser tests (tests/test_browser.py).
# Idempotent: does nothing when /usr/bin/chromium already exists.
# Playwright's own browser download does not work on these machines; the tests drive
# /usr/bin/chromium through Playwright's `executable_path` instead.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo unknown)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
