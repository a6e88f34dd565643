#!/usr/bin/env bash
# `make test`: build both environments if needed, run the trainer suite and the Airflow suite,
# then print how long each part took.  Both suites run even when the first fails, so one CI log
# shows every failure; the exit status is the first failing part's.
set -uo pipefail
cd "$(dirname "$0")/.."

parts=() secs=() codes=()
run_part() {  # run_part NAME COMMAND...
  local name=$1 start=$SECONDS code
  shift
  echo "== $name: $*"
  "$@"
  code=$?
  parts+=("$name") secs+=($((SECONDS - start))) codes+=("$code")
  return "$code"
}

run_part "set-up: Airflow environment" scripts/setup-env.sh airflow || exit $?
run_part "set-up: trainer environment" scripts/setup-env.sh trainer || exit $?
run_part "trainer suite" make --no-print-directory test-trainer
run_part "Airflow suite" make --no-print-directory test-airflow

total=0 status=0
echo
echo "make test: time of each part"
for i in "${!parts[@]}"; do
  result=ok
  [[ ${codes[$i]} == 0 ]] || result="FAILED (exit ${codes[$i]})"
  [[ $status != 0 || ${codes[$i]} == 0 ]] || status=${codes[$i]}
  printf '  %-30s %4dm%02ds  %s\n' "${parts[$i]}" $((secs[i] / 60)) $((secs[i] % 60)) "$result"
  total=$((total + secs[i]))
done
printf '  %-30s %4dm%02ds\n' "total" $((total / 60)) $((total % 60))
exit "$status"
