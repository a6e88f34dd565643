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
"$(dirname "$0")/apt-install.sh" postgresql \
  "the real-Airflow tests need PostgreSQL on 127.0.0.1:5432 (trust, user postgres) or its server programs (initdb, pg_ctl)"
