"""Training on several devices and several machines, on every backend.

The paper trained on one machine with 8 GPUs (section 5.2). One call before
building the model picks each backend's own engine:

| backend | one machine, N devices | several machines |
| --- | --- | --- |
| JAX | `keras.distribution.DataParallel` (or `ModelParallel`) | the same, after `keras.distribution.initialize()` |
| TensorFlow | `tf.distribute.MirroredStrategy` | `tf.distribute.MultiWorkerMirroredStrategy` (`TF_CONFIG`) |
| PyTorch | `DistributedDataParallel`, one process a device (`torchrun`) | the same, `torchrun` on every machine |

```python
from keras_transformer import distribution
from keras_transformer.data import token_budget_batches
from keras_transformer.models import TransformerBackbone, TransformerSeq2SeqLM

strategy = distribution.data_parallel()
with strategy.scope():  # TensorFlow creates the weights here
    backbone = TransformerBackbone(tokenizer.vocabulary_size(), num_layers=3, d_model=256, d_ff=1024, num_heads=4)
    model = TransformerSeq2SeqLM(backbone, preprocessor)
    model.compile()
batches = token_budget_batches(sources, targets, tokenizer, max_tokens=4096, **strategy.batching())
model.fit(batches.dataset(repeat=True), steps_per_epoch=len(batches), epochs=10)
```

The token budget is per device: JAX and TensorFlow split each batch along
the batch axis across the devices of a process, so a process's batches hold
`devices * max_tokens` tokens; with PyTorch each process (one device) makes
its own batches. On several processes each reads its own share of the
batches (`strategy.batching()` gives the arguments).

The loss of a step is the mean over the real target tokens of each device's
part of the batch, averaged over devices (as Keras and DDP reduce it); when
the parts hold different numbers of tokens this weighs tokens slightly
differently from one device reading the whole batch.
"""

import contextlib
import os
import weakref

import keras

# The DistributedDataParallel wrapper of each model (PyTorch).
_torch_ddp_modules = weakref.WeakKeyDictionary()


class Strategy:
    """What `data_parallel()` and `model_parallel()` return.

    Attributes:
        backend: the Keras backend.
        num_processes: processes training together (machines, or on
            PyTorch one process a device).
        process_index: this process's index.
        local_devices: devices that each batch of this process is split
            across.
        engine: the backend's object: a `keras.distribution.Distribution`,
            a `tf.distribute.Strategy`, or None on PyTorch.
    """

    def __init__(self, backend, num_processes, process_index, local_devices, engine=None):
        self.backend = backend
        self.num_processes = num_processes
        self.process_index = process_index
        self.local_devices = local_devices
        self.engine = engine

    @property
    def num_replicas(self):
        """Devices in all, across processes."""
        return self.num_processes * self.local_devices

    def scope(self):
        """The context in which to build and compile the model (needed by
        TensorFlow; harmless elsewhere)."""
        if self.backend == "tensorflow":
            return self.engine.scope()
        return contextlib.nullcontext()

    def batching(self):
        """`token_budget_batches` / `TokenBudgetBatches` arguments for this
        process: `num_replicas`, `num_shards` and `shard_index`."""
        return {"num_replicas": self.local_devices, "num_shards": self.num_processes, "shard_index": self.process_index}

    def __repr__(self):
        return (
            f"Strategy(backend={self.backend!r}, processes={self.num_processes}, "
            f"process_index={self.process_index}, local_devices={self.local_devices}, engine={self.engine!r})"
        )


def tf_process_index(cluster, task_type, task_id):
    """`(processes, index)` of a TensorFlow multi-worker task: the chief (if
    `TF_CONFIG` names one) is process 0, then the workers in order.

    >>> tf_process_index({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "worker", 1)
    (3, 2)
    """
    tasks = [(kind, i) for kind in ("chief", "worker") for i in range(len(cluster.get(kind, [])))]
    if (task_type, task_id) not in tasks:
        return max(len(tasks), 1), 0
    return len(tasks), tasks.index((task_type, task_id))


def initialize_multi_host(coordinator_address=None, num_processes=None, process_id=None):
    """Joins this process to a multi-machine JAX job
    (`keras.distribution.initialize`); call it first on every machine.

    Without arguments it reads the cluster from the environment
    (`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `KERAS_DISTRIBUTION_NUM_PROCESSES`,
    `KERAS_DISTRIBUTION_PROCESS_ID`, or a TPU/Slurm environment). TensorFlow
    reads `TF_CONFIG` and PyTorch `torchrun`'s variables instead: use
    `data_parallel(multi_host=True)` there.
    """
    if keras.config.backend() != "jax":
        raise ValueError(
            "initialize_multi_host is for JAX. On TensorFlow set TF_CONFIG and on "
            "PyTorch launch with torchrun, then call data_parallel(multi_host=True)."
        )
    keras.distribution.initialize(coordinator_address, num_processes, process_id)


def join_and_distribute(devices=None, multi_host=False):
    """`data_parallel(devices, multi_host)` on any backend, for a program
    that runs the same on all three (such as `keras-transformer train
    --multi-host`): on JAX a multi-machine job is joined first
    (`initialize_multi_host`, from the environment); TensorFlow and PyTorch
    join theirs inside `data_parallel`."""
    if devices is not None and multi_host:  # before joining a job, which waits for the others
        data_parallel(devices, multi_host)  # raises, saying why
    if multi_host and keras.config.backend() == "jax":
        initialize_multi_host()
    return data_parallel(devices=devices, multi_host=multi_host)


def data_parallel(devices=None, multi_host=False):
    """Data parallelism with the backend's engine; call before building the
    model.

    Args:
        devices: the devices of this process to use: a number (the first
            N accelerators, or CPUs where there are none), or a list (JAX:
            device strings such as `"gpu:0"`; TensorFlow: strings such as
            `"/gpu:0"`). Default: all of them. On PyTorch each process has
            one device and `torchrun --nproc_per_node N` sets the count; a
            number here must agree with it.
        multi_host: TensorFlow: `MultiWorkerMirroredStrategy` from
            `TF_CONFIG` instead of `MirroredStrategy`; JAX: the global
            devices of a job joined by `initialize_multi_host`. PyTorch
            reads `torchrun`'s environment either way. Not with `devices`.

    Returns:
        A `Strategy`.
    """
    backend = keras.config.backend()
    count = devices if isinstance(devices, int) else None
    if count is not None and count < 1:
        raise ValueError(f"devices must be at least 1, got {count}.")
    if devices is not None and multi_host:
        raise ValueError(
            "devices and multi_host together: a job on several machines trains on every device of "
            "every process. Leave devices out, and limit a machine's devices with CUDA_VISIBLE_DEVICES."
        )
    if multi_host and backend == "tensorflow" and not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "multi_host on TensorFlow joins the job that TF_CONFIG describes, and TF_CONFIG is not set: "
            "set it on every machine (see docs/distribution.md), or leave multi_host out to train alone."
        )
    if multi_host and backend == "torch" and "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "multi_host on PyTorch joins the job that torchrun launched, and this process was not "
            "launched by torchrun: run `torchrun --nnodes N ...` on every machine, or leave multi_host "
            "out to train alone."
        )
    if backend == "jax":
        import jax

        if devices is None or count is not None:
            available = keras.distribution.list_devices()
            if count is not None and count > len(available):
                raise ValueError(f"{count} devices asked for, but this process sees {len(available)}: {available}.")
            devices = available[:count]
        engine = keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(engine)
        local = jax.local_device_count() if multi_host else len(devices)
        return Strategy(backend, jax.process_count(), jax.process_index(), local, engine)
    if backend == "tensorflow":
        import tensorflow as tf

        if multi_host:
            engine = tf.distribute.MultiWorkerMirroredStrategy()
            resolver = engine.cluster_resolver
            workers, index = tf_process_index(resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id)
        else:
            if count is not None:
                available = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
                if count > len(available):
                    raise ValueError(f"{count} devices asked for, but TensorFlow sees {len(available)}.")
                devices = [d.name for d in available[:count]]
            engine = tf.distribute.MirroredStrategy(devices)
            workers, index = 1, 0
        return Strategy(backend, workers, index, engine.num_replicas_in_sync // workers, engine)
    if backend == "torch":
        import torch
        import torch.distributed as dist

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if count is not None and count != world_size:
            raise ValueError(
                f"PyTorch trains with one process a device: launch {count} processes with "
                f"`torchrun --nproc_per_node {count} ...` (this one is 1 of {world_size})."
            )
        if world_size > 1 and not dist.is_initialized():
            if torch.cuda.is_available():
                local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
                if local_rank >= gpus:
                    raise ValueError(
                        f"This process has local rank {local_rank}, but this machine has {gpus} GPU(s): "
                        f"PyTorch trains with one process a GPU. Launch at most {gpus} a machine "
                        f"(`torchrun --nproc_per_node {gpus} ...`), or hide the GPUs "
                        "(CUDA_VISIBLE_DEVICES=) to train on the CPU over gloo."
                    )
                torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = dist.get_rank() if dist.is_initialized() else 0
        return Strategy(backend, world_size, rank, 1)
    raise ValueError(f"Distributed training is not available on the {backend!r} backend.")


def transformer_layout_map(device_mesh, model_axis="model"):
    """A `keras.distribution.LayoutMap` that shards a Transformer's weights
    along the `model_axis` of `device_mesh` (JAX model parallelism).

    As Megatron-LM splits a Transformer layer: the query, key and value
    projections by head (each device computes whole heads), the attention
    output projection by its input heads, the feed-forward network's inner
    layer by its d_ff outputs and its output layer by its d_ff inputs, and
    the shared embedding matrix along d_model. LayerNorm weights and output
    biases stay whole. num_heads, d_ff and d_model must be multiples of the
    model axis size.
    """
    layout_map = keras.distribution.LayoutMap(device_mesh)
    m = model_axis
    layout_map[r".*attention/(query|key|value)/kernel"] = (None, m, None)
    layout_map[r".*attention/(query|key|value)/bias"] = (m, None)
    layout_map[r".*attention/attention_output/kernel"] = (m, None, None)
    layout_map[r".*feed_forward/inner/kernel"] = (None, m)
    layout_map[r".*feed_forward/inner/bias"] = (m,)
    layout_map[r".*feed_forward/output/kernel"] = (m, None)
    layout_map[r".*token_embedding/embeddings"] = (None, m)
    return layout_map


def model_parallel(model_axis_size, devices=None, config=None):
    """Model parallelism on JAX (`keras.distribution.ModelParallel`): the
    devices form a `(batch, model)` mesh; each weight is sharded along
    `model` as `transformer_layout_map` says and each batch along `batch`.

    Args:
        model_axis_size: devices that share one copy of the model.
        devices: the devices (default: all).
        config: optional backbone sizes (`num_heads`, `d_ff`, `d_model`) to
            check against the mesh before building.

    Returns:
        A `Strategy`.
    """
    backend = keras.config.backend()
    if backend != "jax":
        raise ValueError(
            f"Model parallelism runs on JAX (keras.distribution.ModelParallel); on "
            f"{backend} use data_parallel(), which keeps a whole model on each device."
        )
    import jax

    devices = keras.distribution.list_devices() if devices is None else devices
    if len(devices) % model_axis_size:
        raise ValueError(f"{len(devices)} devices cannot form a mesh with a model axis of {model_axis_size}.")
    for name in ("num_heads", "d_ff", "d_model"):
        if config and config.get(name) and config[name] % model_axis_size:
            raise ValueError(f"{name}={config[name]} is not a multiple of the model axis size {model_axis_size}.")
    batch_axis_size = len(devices) // model_axis_size
    mesh = keras.distribution.DeviceMesh((batch_axis_size, model_axis_size), ("batch", "model"), devices)
    engine = keras.distribution.ModelParallel(layout_map=transformer_layout_map(mesh), batch_dim_name="batch")
    keras.distribution.set_distribution(engine)
    return Strategy(backend, jax.process_count(), jax.process_index(), batch_axis_size, engine)


# === PyTorch: Keras's train step through DistributedDataParallel ===


def torch_is_distributed():
    """Whether this PyTorch process trains with others (torchrun)."""
    if keras.config.backend() != "torch":
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def torch_ddp_train_step(model, data):
    """Keras's PyTorch train step (`TorchTrainer.train_step`), with the
    forward pass through `DistributedDataParallel`, whose backward hooks
    average the gradients across processes before the optimizer applies
    them. The wrapper, made on the first step, broadcasts rank 0's weights.
    The loss it logs is averaged across processes too.
    """
    import torch
    import torch.distributed

    ddp = _torch_ddp_modules.get(model)
    if ddp is None:
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        _torch_ddp_modules[model] = ddp
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = ddp(x, training=True)
    model.zero_grad()
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
    # The logged loss is the step's over all processes (the mean of theirs,
    # as the gradients are), not this process's part alone: every process,
    # the chief's progress bar, history and checkpoints see the same value.
    batch_size = next(iter(keras.tree.flatten(x))).shape[0]
    totals = torch.stack([loss.detach().float(), torch.tensor(float(batch_size), device=loss.device)])
    torch.distributed.all_reduce(totals)
    model._loss_tracker.update_state(totals[0] / torch.distributed.get_world_size(), sample_weight=totals[1].item())
    loss = model.optimizer.scale_loss(loss)
    loss.backward()
    weights = model.trainable_weights[:]
    with torch.no_grad():
        model.optimizer.apply([w.value.grad for w in weights], weights)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
