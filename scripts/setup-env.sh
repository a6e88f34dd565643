#!/usr/bin/env bash
# Build (or confirm up to date) the project's environments.
#   scripts/setup-env.sh airflow   -> .venv          (Airflow 3, cncf.kubernetes provider, dev tools;
#                                                    PostgreSQL's server programs if missing)
#   scripts/setup-env.sh trainer   -> .venv-trainer  (TensorFlow 2.15.1, Horovod 0.28.1 with Gloo)
#   scripts/setup-env.sh all       -> both at the same time (`make setup`, `make test`): the Airflow
#                                     environment, and on a new machine PostgreSQL and Chromium,
#                                     are installed while Horovod compiles; lines are prefixed.
# An environment is rebuilt only when its stamp (a hash of its lock file, pyproject.toml and this
# script) changes.  The Horovod wheel is cached outside the repository ($HETERO_CACHE, default
# ~/.cache/hetero-pipelines) so a second set-up on the same machine does not compile it again.
# Packages are byte-compiled at install: TensorFlow imports in about 5 s instead of 14 s where
# PYTHONDONTWRITEBYTECODE is set, and every rank, task and test process starts with an import.
set -euo pipefail
cd "$(dirname "$0")/.."

which_env=${1:?usage: setup-env.sh airflow|trainer}
PYTHON=${PYTHON:-python3.11}
CACHE=${HETERO_CACHE:-$HOME/.cache/hetero-pipelines}
UV_VERSION=0.13.8
HOROVOD_VERSION=0.28.1

# uv (pinned) installs the locked packages quickly; it lives in the cache, not in the repo.
UV=$CACHE/tools/uv-$UV_VERSION/bin/uv
ensure_uv() {
  command -v "$PYTHON" >/dev/null || { echo "ERROR: $PYTHON not found; install Python 3.11" >&2; exit 1; }
  mkdir -p "$CACHE/wheels" "$CACHE/tools"
  if [[ ! -x $UV ]]; then
    echo "installing uv $UV_VERSION into $CACHE/tools"
    "$PYTHON" -m venv "$CACHE/tools/uv-$UV_VERSION"
    "$CACHE/tools/uv-$UV_VERSION/bin/pip" install --quiet "uv==$UV_VERSION"
  fi
}

case "$which_env" in
  airflow) venv=.venv; lock=requirements/airflow.lock ;;
  trainer) venv=.venv-trainer; lock=requirements/trainer.lock ;;
  all)
    ensure_uv  # once, before the two builds share it
    status=$(mktemp)
    { "$0" airflow 2>&1; echo $? > "$status"; } | sed -u 's/^/[.venv] /' &
    "$0" trainer 2>&1 | sed -u 's/^/[.venv-trainer] /'
    trainer=${PIPESTATUS[0]}
    wait
    airflow=$(cat "$status")
    rm -f "$status"
    [[ $trainer == 0 ]] || exit "$trainer"
    exit "${airflow:-1}"
    ;;
  *) echo "unknown environment '$which_env' (airflow|trainer|all)" >&2; exit 2 ;;
esac

# The real-Airflow tests run on PostgreSQL: its server programs where the machine has none.
# The browser test drives the distribution's Chromium: install it where the machine has none.
if [[ $which_env == airflow ]]; then
  scripts/setup-postgres.sh
  scripts/setup-chromium.sh
fi

stamp_value=$(cat "$lock" pyproject.toml "$0" | sha256sum | cut -c1-32)
stamp_file=$venv/.hetero-stamp
if [[ -f $stamp_file && $(cat "$stamp_file") == "$stamp_value" && -x $venv/bin/python ]]; then
  echo "$venv is up to date"
  exit 0
fi

ensure_uv
export UV_CACHE_DIR=$CACHE/uv

echo "building $venv from $lock"
rm -rf "$venv"
"$PYTHON" -m venv "$venv"
"$UV" pip install --quiet --compile-bytecode --python "$venv/bin/python" -r "$lock"
"$UV" pip install --quiet --compile-bytecode --python "$venv/bin/python" --no-deps -e .

if [[ $which_env == trainer ]]; then
  tf_version=$(TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -c "from importlib.metadata import version; print(version('tensorflow-cpu'))")
  py_tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheel_dir=$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$tf_version-$py_tag
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    echo "compiling horovod $HOROVOD_VERSION against TensorFlow $tf_version (about a minute and a half on 2 cores)"
    tmp=$(mktemp -d)
    # Horovod's setup.py always builds RelWithDebInfo (-O3 -g).  The debug information makes the
    # compile about 45% longer (122 s against 84 s on 2 cores) and the library 16 MB instead of 1 MB,
    # and nothing here reads it: the compilers are called through wrappers that drop -g (CXXFLAGS
    # cannot, CMake puts the build type's -g after them).  The code is the same -O3 build.
    mkdir "$tmp/cc"
    for compiler in gcc g++; do
      printf '#!/bin/bash\nargs=()\nfor a in "$@"; do [[ $a == -g ]] || args+=("$a"); done\nexec %s "${args[@]}"\n' \
        "$(command -v $compiler)" > "$tmp/cc/$compiler"
      chmod +x "$tmp/cc/$compiler"
    done
    CC=$tmp/cc/gcc CXX=$tmp/cc/g++ \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
      "$venv/bin/pip" wheel --quiet --no-build-isolation --no-deps --no-cache-dir \
        "horovod==$HOROVOD_VERSION" -w "$tmp"
    mkdir -p "$wheel_dir" && mv "$tmp"/horovod-*.whl "$wheel_dir"/ && rm -r "$tmp"
  fi
  "$UV" pip install --quiet --compile-bytecode --python "$venv/bin/python" --no-deps "$wheel_dir"/horovod-*.whl
  check=$(TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/horovodrun" --check-build 2>&1)
  echo "$check" | grep -q '\[X\] TensorFlow' || { echo "ERROR: horovod was built without TensorFlow:"; echo "$check"; exit 1; } >&2
  echo "$check" | grep -q '\[X\] Gloo' || { echo "ERROR: horovod was built without Gloo:"; echo "$check"; exit 1; } >&2
  echo "horovod $HOROVOD_VERSION: TensorFlow and Gloo available"
fi

echo "$stamp_value" > "$stamp_file"
echo "$venv is ready"
