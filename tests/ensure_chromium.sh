#!/bin/sh
# Make sure Debian's headless-capable Chromium is present for tests/test_chromium.py.
# Called from `make test`. Installs it only when it is missing AND we are root (a CI
# container); otherwise it says why and exits 0: the test then skips with that reason.
set -u
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ensure_chromium: /usr/bin/chromium missing and not root: the Chromium report test will be skipped (install Debian's 'chromium' package to run it)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: /usr/bin/chromium missing and no apt-get: the Chromium report test will be skipped" >&2
    exit 0
fi
echo "ensure_chromium: installing Debian's chromium package (one time)..." >&2
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    echo "ensure_chromium: installed $(/usr/bin/chromium --version 2>/dev/null)" >&2
else
    echo "ensure_chromium: apt-get install chromium failed: the Chromium report test will be skipped" >&2
fi
exit 0
