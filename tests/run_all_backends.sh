#!/usr/bin/env bash
# Runs the whole test suite (tests/ and the docstring examples of the
# package) once per Keras backend; stops at the first backend that fails.
# Tests run in $TEST_WORKERS processes (pytest-xdist; default: 2), a test
# file's tests in one process, so that its module fixtures are made once.
set -euo pipefail
cd "$(dirname "$0")/.."
# Test data that does not depend on the backend (the tiny Marian checkpoint
# that transformers builds) is made once for the three runs, here.
if [ -z "${KERAS_TRANSFORMER_TEST_CACHE:-}" ]; then
    KERAS_TRANSFORMER_TEST_CACHE="$(mktemp -d)"
    KERAS_TRANSFORMER_TEST_CACHE_MADE=1
fi
export KERAS_TRANSFORMER_TEST_CACHE
# One compute thread per test process: the processes share the cores, and
# threads of one process competing with the other's cost more than they
# give (PyTorch's run took 6.6 min with two threads a process, 3.5 with one).
if [ "${TEST_WORKERS:-2}" -gt 1 ]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
    export XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_multi_thread_eigen=false"
fi
# The tests' models are tiny and each is compiled for a few calls: XLA
# (JAX, and TensorFlow's compiled decoding and training steps) compiles
# faster without LLVM's costly optimizations than the code they make runs
# slower (TensorFlow's test_ensemble.py took 94 s instead of 120 s, JAX's
# test_ensemble.py and test_seq2seq_lm.py 255 s instead of 272 s).
export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
# A test that hangs fails after $TEST_TIMEOUT seconds (default: 15 min;
# the slowest test takes about 4 min on 2 cores), printing every thread's
# stack. A test process that crashes fails its test and stops the run
# (--max-worker-restart 0: pytest-xdist can hang for good on replacing a
# crashed process under --dist loadfile). Where tests failed or the run
# stopped so (exit status 1; not where it timed out, after
# $BACKEND_TIMEOUT seconds, default 30 min, or was interrupted), every test
# that did not pass or skip runs once more, in one process (the root
# conftest.py keeps the list), and the backend passes only if they all pass
# then: a native library's crash that does not come back (TensorFlow's run
# died of a segmentation fault in compiled decoding in two runs out of many)
# does not fail the run; a test that fails twice does. Each failure is
# printed either way.
cache_root="$(mktemp -d)"
trap 'rm -rf "$cache_root" ${KERAS_TRANSFORMER_TEST_CACHE_MADE:+"$KERAS_TRANSFORMER_TEST_CACHE"}' EXIT
for backend in ${BACKENDS:-jax tensorflow torch}; do
    echo "=== KERAS_BACKEND=$backend ==="
    options=(-q -o "cache_dir=$cache_root/$backend" --timeout "${TEST_TIMEOUT:-900}")
    status=0
    done_list="$cache_root/$backend.done"
    KERAS_TRANSFORMER_TESTS_DONE="$done_list" KERAS_BACKEND=$backend timeout --signal=INT "${BACKEND_TIMEOUT:-1800}" \
        python -m pytest "${options[@]}" -n "${TEST_WORKERS:-2}" --dist loadfile --max-worker-restart 0 \
        --durations=15 tests keras_transformer "$@" || status=$?
    if [ "$status" -eq 1 ]; then
        echo "=== KERAS_BACKEND=$backend: the tests that failed or did not run, once more ==="
        status=0
        KERAS_TRANSFORMER_SKIP_DONE="$done_list" KERAS_BACKEND=$backend python -m pytest "${options[@]}" \
            --durations=15 tests keras_transformer "$@" || status=$?
        [ "$status" -eq 5 ] && status=0  # (none left: cannot happen after a failure, but not a failure)
    fi
    [ "$status" -eq 0 ] || exit "$status"
done
