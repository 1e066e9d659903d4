"""Compiling the decoding functions on each backend.

Decoding calls the encoder once and the decoder once per output token. Run
op by op, JAX compiles every operation for every new shape and TensorFlow
pays its eager overhead on each; so each function is compiled whole:
`jax.jit` (with the model's variables passed in, so that compiled code never
holds stale weights), `tf.function(jit_compile=True)`, and for PyTorch the
eager function without autograd, its layers called directly
(`keras_transformer.layers.direct_calls`: Keras' work on each layer call
cost more than the arithmetic of a step).

This is the one place where decoding looks at the backend.
"""

import functools

import keras
import numpy as np

from keras_transformer.layers.direct_calls import direct_calls


def compile_for_inference(model, function):
    """`function(*args)` compiled for the current backend.

    Args:
        model: the model whose variables `function` reads.
        function: a function of tensors (and nested tuples/lists of
            tensors) that calls the model's layers.

    Returns:
        A callable with the signature of `function`; its keyword arguments,
        if any, are Python values, compiled as constants.
    """
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        variables = model.variables

        def stateless(values, *args, **kwargs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return function(*args, **kwargs)

        # Keyword arguments are static (Python values): one compilation each.
        compiled = {}

        def call(*args, **kwargs):
            key = tuple(sorted(kwargs.items()))
            if key not in compiled:
                compiled[key] = jax.jit(functools.partial(stateless, **kwargs))
            return compiled[key]([v.value for v in variables], *args)

        return call
    if backend == "tensorflow":
        import tensorflow as tf

        # Without AutoGraph: these functions are written for `jax.jit` too,
        # with no Python control flow on tensors, so its conversion of each
        # function they call (Keras' layers included) is wasted. It took
        # half of tracing an ensemble's search loop (`benchmarks/startup.py`).
        return tf.function(function, jit_compile=True, reduce_retracing=True, autograph=False)
    if backend == "torch":
        import torch

        def eager(*args, **kwargs):
            # Scalars as Python numbers: `ops.slice_update` then writes the
            # cache with plain slicing, not with index tensors.
            args = [a.item() if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in args]
            with torch.no_grad(), direct_calls():
                return function(*args, **kwargs)

        return eager
    return function


def compiles_whole_loops():
    """Whether the backend compiles a `keras.ops.while_loop` whole (JAX and
    TensorFlow, through XLA), so that a search can run on the device from
    start to end; PyTorch runs such a loop step by step from Python."""
    return keras.config.backend() in ("jax", "tensorflow")


def compiles_steps():
    """Whether the backend compiles a decoding step for each input shape
    (JAX, TensorFlow), so that a search should keep to a few shapes;
    PyTorch runs a step of any shape eagerly at no extra cost."""
    return keras.config.backend() in ("jax", "tensorflow")
