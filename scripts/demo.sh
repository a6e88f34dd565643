#!/usr/bin/env bash
# Run the main DAG end to end with `airflow dags test` (SQLite metadata in .airflow/) on the
# local launcher, showing short progress lines, then a summary of at most 15 lines (held-out accuracy,
# training time, balance, the promoted version, where the report, the full log and the JSON are).
set -euo pipefail
cd "$(dirname "$0")/.."
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/.airflow}
mkdir -p "$AIRFLOW_HOME"
.venv/bin/airflow db migrate >"$AIRFLOW_HOME/db-migrate.log" 2>&1 || { cat "$AIRFLOW_HOME/db-migrate.log"; exit 1; }
# compiled once, so that every stage and rank does not compile them again where
# PYTHONDONTWRITEBYTECODE is set (scripts/test-suite.sh)
.venv-trainer/bin/python -m compileall -q -j 0 pipelines plugins dags >/dev/null || true

# A fresh machine's profile bank is empty: profile the demo pool first (the profile_pool DAG: a small
# sweep per device type, the allreduce probe, two reference runs), so the estimate predicts from it.
bank=${HETERO_ARTIFACT_ROOT:-$PWD/artifacts}/_profiles
if [ ! -d "$bank/steps" ] || [ ! -d "$bank/runs" ]; then
  echo "profiling the demo pool into $bank (once; log: $AIRFLOW_HOME/profile.log)"
  profile_conf=${PROFILE_CONF:-'{"size": "small"}'}
  .venv/bin/airflow dags test profile_pool --conf "$profile_conf" >"$AIRFLOW_HOME/profile.log" 2>&1 \
    || { tail -40 "$AIRFLOW_HOME/profile.log"; echo "profiling failed; see $AIRFLOW_HOME/profile.log"; exit 1; }
  grep -E "Marking task" "$AIRFLOW_HOME/profile.log" | .venv/bin/python scripts/demo_summary.py --progress || true
fi

marker=$(mktemp)
# The demo's conf: small_cnn widened to 64 and 128 filters at a global batch of 512, so that one
# step of the slow device (40% of a core, 100 ms CFS period) spans a few quota periods and the
# balance efficiency shows the balancing rather than where the quota stops fall; a 32-unit dense
# layer keeps the gradients to allreduce small (README, "Quick start"). DEMO_CONF replaces it.
demo_conf='{"model": {"name": "small_cnn", "kwargs": {"filters": [64, 128], "dense_units": 32}}, "training": {"global_batch": 512}}'
conf=${DEMO_CONF:-$demo_conf}
echo "running train_pipeline with conf $conf (log: $AIRFLOW_HOME/demo.log)"
set +e
# Progress as short lines (task states, calibration, epochs, re-balancing, errors); the stages' JSON
# results stay in the log and in the run directory (scripts/demo_summary.py --progress).
.venv/bin/airflow dags test train_pipeline --conf "$conf" 2>&1 | tee "$AIRFLOW_HOME/demo.log" \
  | .venv/bin/python -u scripts/demo_summary.py --progress
set -e
echo "----"
.venv/bin/python scripts/demo_summary.py --newer-than "$marker" --log "$AIRFLOW_HOME/demo.log"
rm -f "$marker"
