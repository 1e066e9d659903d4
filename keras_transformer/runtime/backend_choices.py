"""What each backend does differently, decided here, in one place.

The paper's layers and the search ask these questions; the answers, with
the measurements behind them, are kept here by backend, so that no module
of `layers/`, `decoding/` or `models/` reads the backend's name.
"""

import contextlib

import keras

from keras_transformer.runtime.bfloat16_products import xla_on_cpu
from keras_transformer.runtime.direct_calls import direct_calls


# Batches of at most this many sources run in one compiled loop where the
# backend compiles one (`loop.py`), by backend: for them the host search's
# calls cost more than what it saves by dropping finished sources from the
# batch and growing the cache as outputs grow. The host search in segments
# (`_search_in_segments`), the preset's first model, test_2016_flickr,
# beam 4, 2-core AMD EPYC, loop's time / segments' (three alternating
# pairs): JAX batch 1 0.82-0.94, batch 2 0.95-1.21, batch 4 1.30-1.39;
# TensorFlow batch 1 0.71-0.80, batch 2 0.70-0.82, batch 4 0.93-1.09.
LOOP_BATCH_SIZES = {"jax": 1, "tensorflow": 4}


# Where the host search's segments (`search_segment`) hold self-attention
# caches that they never reorder (`runtime.beam_cache`), by backend: a step
# then reorders which row holds each position of a beam's history, not
# every layer's keys and values, but each beam's query is scored against
# every row of its source (4x the attention's products at beam 4).
# Measured with the shipped preset's first model, 512 test_2016_flickr
# sentences 64 at a time, beam 4, 2-core AMD EPYC, four alternating passes
# (time with the plain cache / with this one, median): TensorFlow 1.10x
# (float32) and 1.11x (bfloat16); JAX 1.01x and 0.96-0.99x (again with
# `benchmarks/beam_caches.py`: TensorFlow 1.04x and 1.09x, JAX 1.02x and
# 1.00x, and JAX's bfloat16 BLEU 0.2 lower). One sentence at a
# time in one loop (`search_loop`, 48 sentences, float32) it was slower:
# JAX 0.85x, TensorFlow 0.95x; so that loop keeps a row a beam.
SEGMENT_BEAM_CACHES = {"jax": False, "tensorflow": True}


def loop_batch_size():
    """The largest batch of sources one compiled loop searches by default
    on this backend (`LOOP_BATCH_SIZES`); 0 where it compiles none."""
    return LOOP_BATCH_SIZES.get(keras.config.backend(), 0)


def beam_caches_in_segments():
    """Whether the host search's compiled segments hold self-attention
    caches that they never reorder (`SEGMENT_BEAM_CACHES`)."""
    return SEGMENT_BEAM_CACHES.get(keras.config.backend(), False)


def attends_mixed_in_compute_dtype(heads):
    """Whether mixed precision attends with the products in the compute
    dtype (see `MultiHeadAttention._attend`): on TensorFlow, and on
    PyTorch's CPU."""
    backend = keras.config.backend()
    if backend == "torch":
        return getattr(getattr(heads, "device", None), "type", None) == "cpu"
    return backend == "tensorflow"


def attends_head_major(layer):
    """Whether `layer`'s encoder-decoder attention over a cache runs as
    `head_major_attention`: on JAX, computing in the dtype of its
    weights."""
    return keras.config.backend() == "jax" and layer.compute_dtype == layer.variable_dtype


def reads_output_columns():
    """Whether a tied output projection reads a `(d_model, vocabulary)`
    copy of the embeddings (`SharedTokenEmbedding.output_columns`): in
    decoding compiled by JAX on a CPU."""
    return keras.config.backend() == "jax" and xla_on_cpu()


def writes_loss_gradient():
    """Whether the label-smoothed loss from logits runs with its gradient
    written out (`losses._smoothed_cross_entropy_from_logits`): on JAX and
    TensorFlow; PyTorch's fused log-softmax kernels were faster (see
    there)."""
    return keras.config.backend() != "torch"


def gathers_label_log_probs():
    """Whether the loss reads each label's log-probability by a gather
    (PyTorch), not by comparing the vocabulary's ids with the label (see
    `losses._label_log_prob`)."""
    return keras.config.backend() == "torch"


def direct_calls_where_eager():
    """`direct_calls()` on PyTorch, which runs every layer call of every
    step eagerly: the step's layers skip Keras's per-call work. Where that
    work dominates, a float32 step took 2.55-2.61x as long as
    `torch.nn.Transformer`'s with it and 1.70-1.71x without
    (`benchmarks/step_overhead.py`). JAX and TensorFlow trace the step once
    per shape, so it changes nothing there.
    """
    return direct_calls() if keras.config.backend() == "torch" else contextlib.nullcontext()


def builds_optimizer_before_tracing():
    """Whether a task builds its optimizer's variables before Keras traces
    the training step (`TransformerSeq2SeqLM.make_train_function`): on
    TensorFlow, which otherwise creates them in the first trace and traces
    the step twice."""
    return keras.config.backend() == "tensorflow"
