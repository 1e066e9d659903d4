"""Data parallelism on N simulated devices equals one device on the same
global batch; fit learns; JAX model parallelism equals the unsharded model.

Each backend's check runs in its own processes (tests/distributed_worker.py)
when the suite runs on that backend: JAX with 4 host-platform devices,
TensorFlow with 2 logical CPUs, PyTorch with 2 processes over gloo launched
by torchrun.
"""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
# One SGD step (learning rate 0.5) moves weights by up to ~0.1; float32 sums
# in another order differ by ~1e-7.
TOLERANCE = 1e-5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command, out_dir):
    env = {**os.environ, "KERAS_BACKEND": keras.config.backend(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    if keras.config.backend() == "torch":
        import torch

        if torch.cuda.device_count() < 2:  # two processes need two GPUs: over gloo on the CPU
            env["CUDA_VISIBLE_DEVICES"] = ""
    process = subprocess.run(command + [out_dir], env=env, capture_output=True, text=True, timeout=600)
    assert process.returncode == 0, process.stderr[-4000:]


@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("distributed"))
    if keras.config.backend() == "torch":  # one process, then two
        _run([sys.executable, WORKER, "single"], out)
        _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
              "--master_port", str(_free_port()), WORKER, "parallel"], out)
    else:  # one process with several devices does both
        _run([sys.executable, WORKER, "both"], out)
    reports = []
    for index in range(2 if keras.config.backend() == "torch" else 1):
        with open(os.path.join(out, f"report-{index}.json")) as f:
            reports.append(json.load(f))
    return out, {**reports[0], "processes": reports}  # the chief's, and each process's


def test_data_parallel_step_equals_single_device_step(distributed_run):
    out, report = distributed_run
    assert report["replicas"] == {"jax": 4, "tensorflow": 2, "torch": 2}[keras.config.backend()]
    initial, single, parallel = (np.load(os.path.join(out, f"{n}.npz")) for n in ("initial", "single", "parallel"))
    moved = max(np.abs(single[k] - initial[k]).max() for k in single.files)
    assert moved > 100 * TOLERANCE  # the step did change the weights
    difference = max(np.abs(single[k] - parallel[k]).max() for k in single.files)
    assert difference < TOLERANCE, f"largest weight difference {difference:.2e}"


def test_data_parallel_logs_the_loss_of_the_whole_batch(distributed_run):
    out, report = distributed_run
    with open(os.path.join(out, "single.json")) as f:
        single = json.load(f)["loss"]
    # The step's loss on the global batch (equal token counts on every
    # device), in every process: not one device's part alone.
    for process in report["processes"]:
        assert process["step_loss"] == pytest.approx(single, abs=1e-5)
        np.testing.assert_allclose(process["loss"], report["loss"], atol=1e-5)


def test_data_parallel_fit_lowers_the_loss(distributed_run):
    _, report = distributed_run
    loss = report["loss"]
    assert len(loss) == 4 and all(np.isfinite(loss))
    assert loss[-1] < loss[0] - 0.1, loss


@pytest.mark.skipif(keras.config.backend() != "jax", reason="model parallelism runs on JAX")
def test_jax_model_parallel_equals_unsharded(distributed_run):
    _, report = distributed_run
    # The feed-forward inner kernel (d_model, d_ff) is split along d_ff.
    assert report["feed_forward_sharding"] == "P(None, 'model')"
    assert report["model_parallel_max_difference"] < TOLERANCE


def test_model_parallel_errors():
    from keras_transformer import distribution

    if keras.config.backend() != "jax":
        with pytest.raises(ValueError, match="Model parallelism runs on JAX"):
            distribution.model_parallel(2)
    else:
        with pytest.raises(ValueError, match="cannot form a mesh"):
            distribution.model_parallel(3, devices=["cpu:0"] * 4)
        with pytest.raises(ValueError, match="num_heads=6 is not a multiple"):
            distribution.model_parallel(4, devices=["cpu:0"] * 4, config={"num_heads": 6})


def test_devices_and_multi_host_together_are_refused(monkeypatch):
    from keras_transformer import distribution

    # Several machines train on all their devices: a count would be
    # ignored (TensorFlow) or miscounted per process (JAX).
    with pytest.raises(ValueError, match="devices and multi_host together.*CUDA_VISIBLE_DEVICES"):
        distribution.data_parallel(devices=2, multi_host=True)
    # Several machines without the launcher's environment: not a job of one.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if keras.config.backend() != "jax":
        with pytest.raises(ValueError, match="multi_host on .* joins the job"):
            distribution.data_parallel(multi_host=True)
    from keras_transformer import cli

    with pytest.raises(SystemExit, match="--devices and --multi-host together"):
        cli.main(["train", "--output-dir", "unused", "--devices", "2", "--multi-host"])


@pytest.mark.skipif(keras.config.backend() != "torch", reason="PyTorch's processes")
def test_more_processes_than_gpus_says_how_many_to_launch(monkeypatch):
    """A torchrun process whose local rank has no GPU of its own is told
    how many processes to launch, before it joins the group (where it
    would wait for the others)."""
    import torch
    import torch.distributed as dist

    from keras_transformer import distribution

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("joined the group"))
    with pytest.raises(ValueError, match=r"local rank 1, but this machine has 1 GPU.*--nproc_per_node 1.*CUDA_VISIBLE_DEVICES"):
        distribution.data_parallel()


def test_tf_multi_worker_processes_count_the_chief():
    from keras_transformer.distribution import tf_process_index

    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert [tf_process_index(cluster, *task) for task in (("chief", 0), ("worker", 0), ("worker", 1))] == [
        (3, 0), (3, 1), (3, 2)
    ]
    assert tf_process_index({"worker": ["b:1", "c:1"]}, "worker", 1) == (2, 1)
    assert tf_process_index({}, None, None) == (1, 0)
