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
"$(dirname "$0")/apt-install.sh" chromium \
  "the browser test drives it through Playwright and skips without it; or set HETERO_CHROMIUM"
