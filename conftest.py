"""The whole suite's collection and bookkeeping (`tests/run_all_backends.sh`).

The modules made for PyTorch alone import it at their top and hold no
doctests: they are collected in PyTorch's run only, so that the JAX and
TensorFlow runs do not load PyTorch's native libraries for nothing.

`KERAS_TRANSFORMER_TESTS_DONE=FILE` appends the id of each test that passed
or was skipped to FILE; `KERAS_TRANSFORMER_SKIP_DONE=FILE` leaves out the
tests FILE lists. A run that stopped early (a test process that crashed:
pytest-xdist then stops the run, as `--max-worker-restart 0` asks, since it
can hang on replacing a crashed process under `--dist loadfile`) goes on
with every test that did not pass: the failed ones and those never run.
"""

import os

if os.environ.get("KERAS_BACKEND", "tensorflow") != "torch":
    collect_ignore_glob = ["keras_transformer/runtime/torch_*.py"]

DONE = os.environ.get("KERAS_TRANSFORMER_TESTS_DONE")
SKIP_DONE = os.environ.get("KERAS_TRANSFORMER_SKIP_DONE")


def pytest_runtest_logreport(report):
    # (Written by the process that runs the session: pytest-xdist's
    # controller gets every worker's reports, so its workers write nothing.)
    finished = report.skipped or (report.when == "call" and report.passed)
    if DONE and finished and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(DONE, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")


def pytest_collection_modifyitems(config, items):
    if not SKIP_DONE or not os.path.exists(SKIP_DONE):
        return
    with open(SKIP_DONE, encoding="utf-8") as f:
        done = set(f.read().splitlines())
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
    items[:] = [item for item in items if item.nodeid not in done]
