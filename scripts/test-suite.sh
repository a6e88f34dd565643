#!/usr/bin/env bash
# `make test`: build both environments if needed, then the whole suite in two phases, then how long
# each part took.
#
#   1. The trainer suite (.venv-trainer) and the Airflow suite (.venv) at the same time, each in two
#      processes: the benchmarks' smoke tests (tests/bench) apart from the rest of the trainer suite,
#      the real deployment's tests (tests/integration/airflow, mostly waits on its scheduler and
#      task processes) apart from the rest (DAGs, Kubernetes, the test cluster).  They share
#      nothing but the machine, and on 2 cores one suite alone leaves much of the CPU idle (it
#      waits on the scheduler, on pods, on process starts).  Their output is streamed with a
#      prefix: [trainer], [bench], [airflow] or [deploy].
#   2. The tests marked `timing` (they assert on a measured speed or CPU share: a quota-limited rank
#      is slower, batches follow measured speeds, a 500m pod is planned as the slow device), alone,
#      after phase 1, so that no other test takes the CPU they measure.  Only the test modules that
#      name the mark are given to pytest (timing_tests), so it does not import every module again.
#
# Every part runs even when an earlier one fails, so one CI log shows every failure; the exit status
# is the first failing part's.  TRAINER_TESTS, AIRFLOW_TESTS and PYTEST_OPTS narrow a run as for
# `make test-trainer` / `make test-airflow`.
set -uo pipefail
cd "$(dirname "$0")/.."

DEFAULT_TRAINER_TESTS="tests/unit tests/integration/trainer tests/bench"
TRAINER_TESTS=${TRAINER_TESTS:-$DEFAULT_TRAINER_TESTS}
DEFAULT_AIRFLOW_TESTS="tests/dags tests/k8s tests/cluster tests/integration/airflow"
AIRFLOW_TESTS=${AIRFLOW_TESTS:-$DEFAULT_AIRFLOW_TESTS}
PYTEST_OPTS=${PYTEST_OPTS:--q -p no:cacheprovider --durations=15 -rfE}
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$PWD/dags AIRFLOW__CORE__PLUGINS_FOLDER=$PWD/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES=False HETERO_TRAINER_PYTHON=$PWD/.venv-trainer/bin/python

parts=() secs=() codes=()
logs=$(mktemp -d)  # each pytest run's output, to repeat its FAILED/ERROR lines at the end
run_part() {  # run_part NAME COMMAND...
  local name=$1 start=$SECONDS code
  shift
  echo "== $name: $*"
  "$@"
  code=$?
  parts+=("$name") secs+=($((SECONDS - start))) codes+=("$code")
  return "$code"
}
pytest_in() {  # pytest_in VENV MARK TESTS...: exit 5 (nothing collected) counts as success
  local venv=$1 mark=$2 code
  shift 2
  # shellcheck disable=SC2086  # PYTEST_OPTS is a list of options
  PYTHONUNBUFFERED=1 "$venv/bin/python" -m pytest $PYTEST_OPTS -m "$mark" "$@" 2>&1 | tee "$logs/${PART:-$mark}"
  code=${PIPESTATUS[0]}
  [[ $code == 5 ]] && code=0
  return "$code"
}

run_part "set-up: Airflow environment" scripts/setup-env.sh airflow || exit $?
run_part "set-up: trainer environment" scripts/setup-env.sh trainer || exit $?

echo "== phase 1: the trainer and Airflow suites side by side (all but the timing tests)"
ends=$(mktemp -d)
side() {  # side NAME VENV TESTS...: one suite of phase 1, its lines prefixed, its end time and code kept
  local name=$1 venv=$2 start code
  shift 2
  start=$(date +%s)
  PART=$name pytest_in "$venv" "not timing" "$@" 2>&1 | sed -u "s/^/[$name] /"
  code=${PIPESTATUS[0]}
  echo "$(($(date +%s) - start)) $code" > "$ends/$name"
}
if [[ $TRAINER_TESTS == "$DEFAULT_TRAINER_TESTS" ]]; then  # the default set: the benchmarks' smoke tests apart
  side trainer .venv-trainer tests/unit tests/integration/trainer &
  side bench .venv-trainer tests/bench &
  streams=(trainer bench)
else
  # shellcheck disable=SC2086
  side trainer .venv-trainer $TRAINER_TESTS &
  streams=(trainer)
fi
if [[ $AIRFLOW_TESTS == "$DEFAULT_AIRFLOW_TESTS" ]]; then  # the default set: the deployment's tests apart
  side airflow .venv tests/dags tests/k8s tests/cluster &
  side deploy .venv tests/integration/airflow &
  streams+=(airflow deploy)
else
  # shellcheck disable=SC2086
  side airflow .venv $AIRFLOW_TESTS &
  streams+=(airflow)
fi
wait
for name in "${streams[@]}"; do
  read -r took code < "$ends/$name" || { took=0 code=1; }
  case $name in
    deploy) label="Airflow suite: real deployment" ;;
    airflow) label="Airflow suite: DAGs, Kubernetes" ;;
    bench) label="trainer suite: benchmarks" ;;
    *) label="$name suite" ;;
  esac
  parts+=("$label") secs+=("$took") codes+=("$code")
done
rm -rf "$ends"

timing_tests() {  # timing_tests TESTS...: those of TESTS that can hold a test marked timing
  # A test module (test_*.py, *_test.py) that names the mark (`pytest.mark.timing`, a module's
  # `pytestmark`, `marks=`, `add_marker`), its `::` node ids kept; a conftest.py that names it may
  # mark a whole folder: that folder, or a file given below it.  So phase 2 imports a handful of
  # modules, not the ~150 of phase 1.  An argument that is neither a file nor a folder (an option,
  # a missing path) is passed on as it is, for pytest to use or refuse.
  local arg path file dir mark='(\bmark\s*\.\s*timing\b|add_marker\([^)]*timing)'
  for arg in "$@"; do
    path=${arg%%::*}
    if [[ -d $path ]]; then
      grep -rlE --include='*.py' "$mark" "$path" | sort | while read -r file; do
        case ${file##*/} in
          conftest.py) dirname "$file" ;;
          test_*.py | *_test.py) echo "$file" ;;
        esac
      done
    elif [[ -f $path ]]; then
      dir=$(dirname "$path")
      while ! grep -qE "$mark" "$path" "$dir/conftest.py" 2>/dev/null && [[ $dir != . && $dir != / ]]; do
        dir=$(dirname "$dir")
      done
      grep -qE "$mark" "$path" "$dir/conftest.py" 2>/dev/null && echo "$arg"
    else
      echo "$arg"
    fi
  done | awk '!seen[$0]++'
}
pytest_timing() {  # pytest_timing VENV TESTS...: the tests marked timing among TESTS, or none to run
  local venv=$1 files
  shift
  mapfile -t files < <(timing_tests "$@")
  if [[ ${#files[@]} == 0 ]]; then
    echo "no test marked timing in: $*"
    return 0
  fi
  pytest_in "$venv" timing "${files[@]}"
}
# shellcheck disable=SC2086
PART=timing-trainer run_part "timing tests, trainer (alone)" pytest_timing .venv-trainer $TRAINER_TESTS
# shellcheck disable=SC2086
PART=timing-airflow run_part "timing tests, Airflow (alone)" pytest_timing .venv $AIRFLOW_TESTS

total=0 status=0
echo
echo "make test: time of each part (the suites of phase 1 ran at the same time)"
for i in "${!parts[@]}"; do
  result=ok
  [[ ${codes[$i]} == 0 ]] || result="FAILED (exit ${codes[$i]})"
  [[ $status != 0 || ${codes[$i]} == 0 ]] || status=${codes[$i]}
  printf '  %-32s %4dm%02ds  %s\n' "${parts[$i]}" $((secs[i] / 60)) $((secs[i] % 60)) "$result"
done
printf '  %-32s %4dm%02ds\n' "total (wall)" $((SECONDS / 60)) $((SECONDS % 60))
failed=$(grep -E '^(FAILED|ERROR) ' "$logs"/* 2>/dev/null | sed "s|^$logs/||" | cut -c1-300)
if [[ -n $failed ]]; then  # CI keeps only the log's tail: name what failed there
  echo
  echo "make test: the failing tests (the reasons are above)"
  echo "$failed"
fi
rm -rf "$logs"
exit "$status"
