#!/usr/bin/env bash
# Chromium for the browser test (tests/integration/airflow/test_browser.py): Playwright drives the
# distribution's Chromium (/usr/bin/chromium), because Playwright's own browser download is not
# reachable from every machine.  This installs Debian's `chromium` package where no Chromium is
# found and does nothing otherwise.  Without root (or sudo without a password) or apt-get it only
# says so: the browser test then skips, naming what is missing.  HETERO_CHROMIUM names another
# executable.
set -euo pipefail

for candidate in "${HETERO_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  if [[ -n $candidate && -x $candidate ]]; then
    exit 0
  fi
done
root=()  # how to run apt-get as root
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  root=(sudo -n)
fi
if ! command -v apt-get >/dev/null || [[ $(id -u) -ne 0 && ${#root[@]} -eq 0 ]]; then
  echo "NOTE: no Chromium (/usr/bin/chromium) and no way to install it here (apt-get as root):" \
       "the browser test will skip; install your distribution's chromium or set HETERO_CHROMIUM" >&2
  exit 0
fi
echo "installing Debian's chromium package (the browser test drives it through Playwright)"
export DEBIAN_FRONTEND=noninteractive
"${root[@]}" apt-get update -qq
"${root[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
