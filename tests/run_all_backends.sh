#!/usr/bin/env bash
# Runs the whole test suite (tests/ and the docstring examples of the
# package) once per Keras backend; stops at the first backend that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
for backend in ${BACKENDS:-jax tensorflow torch}; do
    echo "=== KERAS_BACKEND=$backend ==="
    KERAS_BACKEND=$backend python -m pytest -q -p no:cacheprovider tests keras_transformer "$@"
done
