#!/bin/sh
# Make sure Debian's headless-capable Chromium is present for tests/test_chromium.py.
# Called from `make test`. When it is missing AND we are root (a CI container) AND apt-get
# is there, it INSTALLS Debian's `chromium` package with apt-get (apt-get update, then
# apt-get install --no-install-recommends chromium: about 100 MB). Otherwise it says why
# and exits 0: the one Chromium test (tests/test_chromium.py) then skips with that reason.
#
# Opt out: RECSYS_DOCTOR_NO_CHROMIUM=1 (or `make test NO_CHROMIUM=1`): nothing is installed.
set -u
case "${RECSYS_DOCTOR_NO_CHROMIUM:-}" in
    ""|0) ;;
    *)
        echo "ensure_chromium: RECSYS_DOCTOR_NO_CHROMIUM is set: not installing Chromium; without /usr/bin/chromium the Chromium report test (tests/test_chromium.py) is skipped" >&2
        exit 0 ;;
esac
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
echo "ensure_chromium: installing Debian's chromium package as root with apt-get, once, for the HTML report test (make test NO_CHROMIUM=1 or RECSYS_DOCTOR_NO_CHROMIUM=1 to skip)..." >&2
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    echo "ensure_chromium: installed $(/usr/bin/chromium --version 2>/dev/null)" >&2
else
    echo "ensure_chromium: apt-get install chromium failed: the Chromium report test will be skipped" >&2
fi
exit 0
