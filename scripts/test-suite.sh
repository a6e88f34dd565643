#!/usr/bin/env bash
# `make test`: build both environments if needed, then the whole suite in two phases, then how long
# each part took.
#
#   1. The trainer suite (.venv-trainer) and the Airflow suite (.venv) at the same time, in three and
#      two processes: the unit tests, the trainer's integration tests and the benchmarks' smoke
#      tests (tests/bench) apart; the real deployment's tests (tests/integration/airflow, mostly
#      waits on its scheduler and task processes) apart from the rest (DAGs, Kubernetes, the test
#      cluster).  They share nothing but the machine, and on 2 cores one suite alone leaves much of
#      the CPU idle (it waits on the scheduler, on pods, on process starts).  Their output is streamed with a
#      prefix: [unit], [trainer], [bench], [airflow] or [deploy].
#   2. The tests marked `timing` (they assert on a measured speed or CPU share: a quota-limited rank
#      is slower, batches follow measured speeds, a 500m pod is planned as the slow device), one
#      suite after the other, never beside another timing test.  Only the test modules that name
#      the mark are given to pytest (timing_tests), so it does not import every module again.
#      Where a cpu cgroup controller can be written (root), they run from the start, beside phase 1,
#      and phase 1 runs in a group of the least CPU weight (HETERO_CGROUP_PARENT puts its ranks'
#      quota groups there too): the kernel gives the timing tests the CPU whenever they want it, as
#      if they ran alone, and phase 1 takes what they leave (they leave half of it: they wait on
#      quota-limited ranks and pods).  The timing tests' own ranks go in a group of the most
#      weight, so that a rank phase 1 starts at the default weight cannot slow them either.
#      Elsewhere they run after phase 1, alone.
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

parts=() secs=() codes=() cpus=()
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
  # tests/cpu_usage.py: each test's CPU time, the costliest printed at the end (importable as
  # tests.cpu_usage from the repository's root, which `python -m` puts on sys.path)
  # shellcheck disable=SC2086  # PYTEST_OPTS is a list of options
  PYTHONUNBUFFERED=1 "$venv/bin/python" -m pytest -p tests.cpu_usage $PYTEST_OPTS -m "$mark" "$@" 2>&1 | tee "$logs/${PART:-$mark}"
  code=${PIPESTATUS[0]}
  [[ $code == 5 ]] && code=0
  return "$code"
}

run_part "set-up: both environments" scripts/setup-env.sh all || exit $?
# The project's own modules compiled once (both environments run the same Python 3.11, so one
# __pycache__ serves both).  Where PYTHONDONTWRITEBYTECODE is set, as on the CI machines, every
# process otherwise compiles the project's modules it imports from source, each time: measured
# 0.1 CPU-s for a DAG file's parse with its plugins, 0.2 for a process importing 111 of the
# pipeline's modules (on the slowest 2-core VM so far), over the suite's hundreds of processes
# (ranks, stages, Airflow's task processes, pods).  A stale file is only ignored: Python checks
# each one against its source.
"$PWD/.venv-trainer/bin/python" -m compileall -q -j 0 pipelines plugins dags tests bench scripts >/dev/null \
  || echo "byte-compiling the project failed; the suite runs from source"

ends=$(mktemp -d)  # each concurrent part's "seconds exit-code", by name
background_group() {  # a cpu cgroup of the least weight for phase 1, or nothing where none can be made
  local base version=1
  if [[ -f /sys/fs/cgroup/cpu/cpu.shares ]]; then base=/sys/fs/cgroup/cpu
  elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    base=/sys/fs/cgroup version=2
  else return 1
  fi
  local group=$base/hetero-make-test-$$
  {
    [[ $version == 1 ]] || grep -qw cpu "$base/cgroup.subtree_control" || echo +cpu > "$base/cgroup.subtree_control"
    mkdir -p "$group" && if [[ $version == 1 ]]; then echo 2 > "$group/cpu.shares"; else echo 1 > "$group/cpu.weight"; fi
    # v2 lets a group with a controller on for its children hold no process: the suites go in a leaf
    [[ $version == 1 ]] || echo +cpu > "$group/cgroup.subtree_control"
    mkdir -p "$group/suites" "$group/ranks"
  } 2>/dev/null || { rmdir "$group/suites" "$group/ranks" "$group" 2>/dev/null; return 1; }
  # Beside it, a group of the most weight for the timing tests' ranks (timing): a rank that a
  # suite of phase 1 places at the default weight (the real deployment's components start their
  # runs with an environment of their own) must not take a measured rank's CPU.  Without it the
  # timing tests' ranks only have the default weight.
  { mkdir -p "$group-timing" && if [[ $version == 1 ]]; then echo 262144 > "$group-timing/cpu.shares"
    else echo 10000 > "$group-timing/cpu.weight"; fi; } 2>/dev/null || rmdir "$group-timing" 2>/dev/null
  echo "$group"
}
record() {  # record NAME COMMAND...: one concurrent part, its lines prefixed, its end time and code kept
  local name=$1 start code
  shift
  start=$(date +%s)
  PART=$name "$@" 2>&1 | sed -u "s/^/[$name] /"
  code=${PIPESTATUS[0]}
  echo "$(($(date +%s) - start)) $code" > "$ends/$name"
}
side() {  # side NAME VENV TESTS...: one suite of phase 1
  local name=$1 venv=$2
  shift 2
  if [[ -n $bg ]]; then  # this subshell and all it starts: the low-weight group, its ranks' groups below it
    echo "$BASHPID" > "$bg/suites/cgroup.procs"
    export HETERO_CGROUP_PARENT=${bg##*/}/ranks  # the group lies right under the controller's root
  fi
  record "$name" pytest_in "$venv" "not timing" "$@"
}
timing() {  # the timing tests of both suites, one after the other
  # their ranks in the group of the most weight, where there is one (background_group)
  [[ -z $bg || ! -d $bg-timing ]] || export HETERO_CGROUP_PARENT=${bg##*/}-timing
  # shellcheck disable=SC2086
  record timing-trainer pytest_timing .venv-trainer $TRAINER_TESTS
  # shellcheck disable=SC2086
  record timing-airflow pytest_timing .venv $AIRFLOW_TESTS
}

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
bg=$(background_group) || bg=
if [[ -n $bg ]]; then
  echo "== phase 1 in the low-weight cgroup $bg, the timing tests beside it at full weight"
else
  echo "== no writable cpu cgroup controller: the timing tests run after phase 1, alone"
fi
echo "== phase 1: the trainer and Airflow suites side by side (all but the timing tests)"
if [[ $TRAINER_TESTS == "$DEFAULT_TRAINER_TESTS" ]]; then  # the default set: the benchmarks' smoke tests apart
  MOVED_SMOKE=tests/bench/test_smoke.py::test_estimator
  # The unit tests take about half as long as the other streams: two of the benchmarks' smoke
  # tests (first_run, about 4.5 min under the suite's load, and the estimator's, about 2.5 min) run
  # after them, so that no stream ends far behind the others (the CPU is busy until the last
  # stream ends: a stream that ends alone leaves a core idle).
  side unit .venv-trainer tests/unit tests/bench/test_first_run_smoke.py $MOVED_SMOKE &
  side trainer .venv-trainer tests/integration/trainer &
  side bench .venv-trainer tests/bench --ignore=tests/bench/test_first_run_smoke.py --deselect $MOVED_SMOKE &
  streams=(unit trainer bench)
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
if [[ -n $bg ]]; then
  echo "== phase 2: the timing tests, beside phase 1"
  timing &
  wait
else
  wait
  echo "== phase 2: the timing tests, alone"
  timing
fi
[[ -z $bg ]] || rmdir "$bg/suites" "$bg/ranks" "$bg" 2>/dev/null || echo "(cgroup $bg left: a process of the suites lives on)"
[[ -z $bg || ! -d $bg-timing ]] || rmdir "$bg-timing" 2>/dev/null || echo "(cgroup $bg-timing left: a rank of the timing tests lives on)"
for name in "${streams[@]}" timing-trainer timing-airflow; do
  read -r took code < "$ends/$name" || { took=0 code=1; }
  case $name in
    deploy) label="Airflow suite: real deployment" ;;
    airflow) label="Airflow suite: DAGs, Kubernetes" ;;
    bench) label="trainer suite: benchmarks" ;;
    unit) label="trainer suite: unit, first_run" ;;
    trainer) label="trainer suite: integration" ;;
    timing-trainer) label="timing tests, trainer" ;;
    timing-airflow) label="timing tests, Airflow" ;;
    *) label="$name suite" ;;
  esac
  parts+=("$label") secs+=("$took") codes+=("$code")
  cpus[${#parts[@]} - 1]=$(sed -n 's/.*cpu_usage: \([0-9]*\) CPU-s in this session.*/\1/p' "$logs/$name" 2>/dev/null | tail -1)
done
rm -rf "$ends"

total=0 status=0 cpu_total=0
echo
echo "make test: time of each part (the suites of phase 1 ran at the same time; the timing tests beside them"
echo "where cgroups allowed), and the CPU time its pytest process and the processes it waited for took"
for i in "${!parts[@]}"; do
  result=ok
  [[ ${codes[$i]} == 0 ]] || result="FAILED (exit ${codes[$i]})"
  [[ $status != 0 || ${codes[$i]} == 0 ]] || status=${codes[$i]}
  cpu=${cpus[$i]:-}
  [[ -z $cpu ]] || cpu_total=$((cpu_total + cpu))
  printf '  %-32s %4dm%02ds  %6s  %s\n' "${parts[$i]}" $((secs[i] / 60)) $((secs[i] % 60)) "${cpu:+${cpu} CPU-s}" "$result"
done
printf '  %-32s %4dm%02ds  %6s\n' "total (wall)" $((SECONDS / 60)) $((SECONDS % 60)) "$cpu_total CPU-s"
failed=$(grep -E '^(FAILED|ERROR) ' "$logs"/* 2>/dev/null | sed "s|^$logs/||" | cut -c1-300)
if [[ -n $failed ]]; then  # CI keeps only the log's tail: name what failed there
  echo
  echo "make test: the failing tests (the reasons are above)"
  echo "$failed"
fi
rm -rf "$logs"
exit "$status"
