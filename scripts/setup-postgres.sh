#!/usr/bin/env bash
# PostgreSQL for the real-Airflow tests (tests/integration/airflow/real_airflow.py): they use the
# machine's own server when one answers on 127.0.0.1:5432 (trust authentication, user postgres), or
# else start a private server of their own from the system's server programs (initdb, pg_ctl).
# This installs Debian's `postgresql` package where no server program is found, on PATH or under
# /usr/lib/postgresql/<major>/bin, and does nothing otherwise.  Without root (or sudo without a
# password) or apt-get it only says so: the tests then skip, naming what is missing.
set -euo pipefail

if command -v pg_ctl >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
  exit 0
fi
root=()  # how to run apt-get as root
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  root=(sudo -n)
fi
if ! command -v apt-get >/dev/null || [[ $(id -u) -ne 0 && ${#root[@]} -eq 0 ]]; then
  echo "NOTE: no PostgreSQL server programs (initdb, pg_ctl) and no way to install them here (apt-get as root):" \
       "the real-Airflow tests need PostgreSQL on 127.0.0.1:5432 (trust, user postgres) or those programs" >&2
  exit 0
fi
echo "installing Debian's postgresql package (server programs for the real-Airflow tests)"
export DEBIAN_FRONTEND=noninteractive
"${root[@]}" apt-get update -qq
"${root[@]}" apt-get install -y -qq --no-install-recommends postgresql >/dev/null
