#!/usr/bin/env bash
# Run the main DAG end to end with `airflow dags test` (SQLite metadata in .airflow/) on the
# local launcher, then print where the report is and the held-out accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/.airflow}
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/db-migrate.log"; exit 1; }

marker=$(mktemp)
conf=${DEMO_CONF:-'{}'}
echo "running train_pipeline with conf $conf (log: $AIRFLOW_HOME/demo.log)"
set +e
.venv/bin/airflow dags test train_pipeline --conf "$conf" 2>&1 | tee "$AIRFLOW_HOME/demo.log" | grep -E --line-buffered "Marking task|ERROR|calibrated|re-balance|epoch [0-9]+ done|training done|learning rate|\[rank 0\].*(loss|accuracy)" 
set -e
.venv/bin/python scripts/demo_summary.py --newer-than "$marker"
rm -f "$marker"
