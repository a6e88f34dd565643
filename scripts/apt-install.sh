#!/usr/bin/env bash
# apt-install.sh PACKAGE WHY: install one of Debian's packages as root (or with sudo without a
# password), for scripts/setup-postgres.sh and scripts/setup-chromium.sh.  Where neither apt-get
# nor root is available it only prints a NOTE saying what is missing and why it matters, and exits
# 0: the tests that need the package then skip, naming it.
set -euo pipefail
package=${1:?usage: apt-install.sh PACKAGE WHY}
why=${2:?usage: apt-install.sh PACKAGE WHY}

root=()  # how to run apt-get as root
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  root=(sudo -n)
fi
if ! command -v apt-get >/dev/null || [[ $(id -u) -ne 0 && ${#root[@]} -eq 0 ]]; then
  echo "NOTE: Debian's $package is missing and cannot be installed here (apt-get as root): $why" >&2
  exit 0
fi
echo "installing Debian's $package package ($why)"
export DEBIAN_FRONTEND=noninteractive
"${root[@]}" apt-get update -qq
"${root[@]}" apt-get install -y -qq --no-install-recommends "$package" >/dev/null
