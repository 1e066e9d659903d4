"""Compiling the decoding functions on each backend.

Decoding calls the encoder once and the decoder once per output token. Run
op by op, JAX compiles every operation for every new shape and TensorFlow
pays its eager overhead on each; so each function is compiled whole:
`jax.jit` (with the model's variables passed in, so that compiled code never
holds stale weights, and on a CPU a transposed copy of its output
embeddings, `SharedTokenEmbedding.output_columns`, made again when they
change), `tf.function(jit_compile=True)`, and for PyTorch the
eager function without autograd, its layers called directly
(`keras_transformer.runtime.direct_calls`: Keras' work on each layer call
cost more than the arithmetic of a step).

This is the one place where decoding looks at the backend.
"""

import contextlib
import functools
import inspect
import os

import keras
import numpy as np

# Keras has no public accessor for the scopes `Variable.value` reads.
from keras.src.backend import get_autocast_scope
from keras.src.backend import in_stateless_scope

from keras_transformer.runtime.bfloat16_products import bound_output_columns
from keras_transformer.runtime.bfloat16_products import output_columns_of
from keras_transformer.runtime.bfloat16_products import xla_decoding
from keras_transformer.runtime.bfloat16_products import xla_on_cpu
from keras_transformer.runtime.direct_calls import direct_calls


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
        shared = compile_for_models(model, lambda _, *args, **kwargs: function(*args, **kwargs))
        return functools.partial(shared, model)
    if backend == "tensorflow":
        import tensorflow as tf

        # Without AutoGraph: these functions are written for `jax.jit` too,
        # with no Python control flow on tensors, so its conversion of each
        # function they call (Keras' layers included) is wasted. It took
        # half of tracing an ensemble's search loop (`benchmarks/startup.py`).
        # One trace a shape is the design: TensorFlow's warning about
        # frequent retracing says nothing to act on (`compile_for_models`).
        tf.get_logger().addFilter(_not_about_retracing)
        traced = _traced_by_shapes(
            tf.function(_in_xla_decoding(function), jit_compile=True, reduce_retracing=True, autograph=False)
        )
        return lambda *args, **kwargs: traced((), args, kwargs)
    if backend == "torch":
        import torch

        def eager(*args, **kwargs):
            # Scalars as Python numbers: `ops.slice_update` then writes the
            # cache with plain slicing, not with index tensors.
            args = [a.item() if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in args]
            # Inference mode: PyTorch keeps no view or version records of
            # the tensors made (a translation one sentence at a time: 8%
            # faster than under `no_grad`).
            with torch.inference_mode(), direct_calls():
                return function(*args, **kwargs)

        return eager
    return function


def compile_for_models(template, function):
    """`function(model, *args)` compiled once for every model built as
    `template` is (the same `structure_key`), reading the weights of
    the model it is called with.

    On JAX and TensorFlow the compiled code takes the model's weights as
    inputs: `function` is traced with `template`, its variables standing
    for the weights passed in (`keras.StatelessScope`). The models of an
    ensemble preset are built alike, so that one compilation of each
    decoding function serves all of them
    (`interface.decoding_functions`). On PyTorch, `function(model, *args)`
    runs as `compile_for_inference` runs a function.

    Returns:
        `call(model, *args, **kwargs)`; keyword arguments are Python
        values, compiled as constants.
    """
    backend = keras.config.backend()
    if backend not in ("jax", "tensorflow"):
        return compile_for_inference(template, function)
    variables = template.variables
    projecting = _projecting_layers(template)
    # Each model's variable list (and layers with output columns),
    # gathered once (Keras walks every layer for them): the compiled
    # functions go when variables change
    # (`interface.forget_decoding_functions`).
    held = {}

    def held_for(model):
        if id(model) not in held:
            held[id(model)] = (model, model.variables, _projecting_layers(model))
        return held[id(model)]

    def values_of(model):
        return _values(held_for(model)[1])

    def columns_of(model):
        """The output columns (`SharedTokenEmbedding.output_columns`) of
        the model's layers that have them, in the template's order (None
        for a layer without): inputs of the compiled function, so that
        the copies, made outside it, follow the model's weights."""
        return [layer.output_columns() for layer in held_for(model)[2]]

    def stateless(values, columns, *args, **kwargs):
        bound = {id(layer): c for layer, c in zip(projecting, columns) if c is not None}
        with keras.StatelessScope(state_mapping=list(zip(variables, values))), bound_output_columns(bound), xla_decoding():
            return function(template, *args, **kwargs)

    if backend == "jax":
        import jax

        # Keyword arguments are static (Python values): one compilation each.
        compiled = {}

        def call(model, *args, **kwargs):
            key = tuple(sorted(kwargs.items()))
            function = compiled.get(key)
            if function is None:  # (threads that race here all get the one stored first)
                function = compiled.setdefault(key, jax.jit(functools.partial(stateless, **kwargs)))
            return function(values_of(model), columns_of(model), *args)

        return call
    import tensorflow as tf

    compiled = tf.function(stateless, jit_compile=True, reduce_retracing=True, autograph=False)
    # One trace a shape is the design (as for `compile_for_inference`):
    # TensorFlow's warning about frequent retracing, which the models of
    # an ensemble calling one function set off, says nothing to act on.
    tf.get_logger().addFilter(_not_about_retracing)

    traced = _traced_by_shapes(compiled)

    def call(model, *args, **kwargs):
        # (No output columns here: `SharedTokenEmbedding.output_columns`
        # is for JAX, where it was measured.)
        return traced((values_of(model), ()), args, kwargs)

    return call


def _traced_by_shapes(compiled):
    """`call(leading, args, kwargs)`: `compiled(*leading, *args,
    **kwargs)` (a `tf.function`) through its trace for the shapes and
    dtypes of `args` and the values of `kwargs`, found in a dict of its own.

    A call through `tf.function` matches every argument against its traces
    (and the leading ones, a model's weights where `compile_for_models`
    passes them, are a hundred tensors or more): a 4+4-layer model's
    step at 256 rows took 21.5 against 20.2 ms. Calling the trace found
    by shapes skips that: the shipped preset's step at 4 rows (one
    sentence's beams) took 1.2 against 2.0-2.3 ms; its translations
    (test_2016_flickr, beam 4, 2-core CPU, alternating passes) 64 at a
    time ran 1.10x as fast (median of five), one at a time 1.07x. Where
    `compiled` is called while a graph is traced, the call goes through
    it as it is.
    """
    import tensorflow as tf

    traces = {}
    parameters = inspect.signature(compiled.python_function).parameters

    def call(leading, args, kwargs):
        if not tf.executing_eagerly():
            return compiled(*leading, *args, **kwargs)
        key = _shapes(args, kwargs)
        found = traces.get(key)
        if found is None:
            # (A trace takes every argument: those left to their defaults too.)
            given = len(leading) + len(args)
            defaults = {
                name: p.default for name, p in list(parameters.items())[given:]
                if p.default is not p.empty and p.kind is p.POSITIONAL_OR_KEYWORD and name not in kwargs
            }
            kwargs = {**kwargs, **defaults}
            found = traces[key] = (compiled.get_concrete_function(*leading, *args, **kwargs), defaults)
            return found[0](*leading, *args, **kwargs)
        trace, defaults = found
        return trace(*leading, *args, **kwargs, **defaults)

    return call


def _in_xla_decoding(function):
    """`function` traced inside `bfloat16_products.xla_decoding()`, with its
    signature (`_traced_by_shapes` reads its defaults)."""

    @functools.wraps(function)
    def traced(*args, **kwargs):
        with xla_decoding():
            return function(*args, **kwargs)

    return traced


@contextlib.contextmanager
def loop_output_columns(model):
    """Within this context, in a function that TensorFlow compiles for a
    CPU, `model`'s output projection reads a transposed copy of its
    embeddings (`SharedTokenEmbedding.output_columns`' layout), made in
    the function once, before the loop that the context is to hold: for
    `loop.search_loop`, whose steps all project through it. On JAX the
    compiled functions take the copy as an input already
    (`compile_for_models`); elsewhere this does nothing.

    XLA's CPU product of a few rows by a transposed matrix runs at half
    the speed of a product by the matrix of the transposed layout. One
    sentence at a time (a loop a sentence; the shipped preset's first
    model, 48 test_2016_flickr sentences, five alternating passes in two
    processes, 2-core AMD EPYC), translations ran 1.06x as fast so in
    float32 (median time ratio 0.945) and 1.04x in bfloat16 (0.965). In
    `loop.search_segment` (batches of at least 8 sources' beams, a copy
    each call) it gained nothing: time ratios 1.03, 0.96, 1.08 for 256
    sentences 64 at a time.
    """
    if keras.config.backend() != "tensorflow" or not xla_on_cpu():
        yield
        return
    import tensorflow as tf

    if tf.executing_eagerly():
        yield
        return
    bound = {
        id(layer): keras.ops.transpose(layer.embeddings.value)
        for layer in _projecting_layers(model)
        if layer.projects_through_columns() and output_columns_of(layer) is None
    }
    with bound_output_columns(bound):
        yield


def _values(variables):
    """Each variable's value, as `Variable.value` gives it: read from the
    variable directly where no stateless or autocast scope is open, as
    the property then returns it. A search passes a model's weights to
    each call of a compiled function (at every step of a host search, for
    each model of an ensemble), and the property's checks took 200 us for
    a preset's 179 variables, reading them directly 3 us."""
    if in_stateless_scope() or get_autocast_scope() is not None:
        return [v.value for v in variables]
    return [v.value if v._value is None else v._value for v in variables]


def _projecting_layers(model):
    """The layers of `model` that may project through output columns
    (`SharedTokenEmbedding.output_columns`), in a fixed order: an
    ensemble's (`decoding.ensemble.Ensemble`) model by model; none for an
    object without layers."""
    members = getattr(model, "models", None)
    if members is not None:
        return [layer for member in members for layer in _projecting_layers(member)]
    flatten = getattr(model, "_flatten_layers", None)
    return [] if flatten is None else [layer for layer in flatten() if hasattr(layer, "output_columns")]


def _shapes(args, kwargs):
    """What tells apart the traces of a function of these arguments: their
    nesting (lists and tuples apart, as `tf.function` traces them), the
    shape and dtype of each tensor or array, the other values themselves."""
    return _signature(args), tuple((name, _signature(value)) for name, value in sorted(kwargs.items()))


def _signature(x):
    if isinstance(x, (list, tuple)):
        return type(x), tuple(_signature(item) for item in x)
    if isinstance(x, dict):
        return dict, tuple((key, _signature(x[key])) for key in sorted(x))
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return tuple(x.shape), str(x.dtype)
    return x


def _not_about_retracing(record):
    return "triggered tf.function retracing" not in record.getMessage()


def structure_key(model):
    """What models built alike share, so that code compiled for one runs
    the others (`compile_for_models`): their class, their backbone's config
    but for its name, and the shapes and dtypes of their variables, in
    order. None for a model without a backbone config."""
    get_config = getattr(getattr(model, "backbone", None), "get_config", None)
    if get_config is None:
        return None
    config = {key: value for key, value in get_config().items() if key != "name"}
    variables = tuple((tuple(v.shape), keras.backend.standardize_dtype(v.dtype)) for v in model.variables)
    return type(model), repr(sorted(config.items())), variables


def compiles_whole_loops():
    """Whether the backend compiles a `keras.ops.while_loop` whole (JAX and
    TensorFlow, through XLA), so that a search can run on the device from
    start to end; PyTorch runs such a loop step by step from Python."""
    return keras.config.backend() in ("jax", "tensorflow")


def concurrent_parts():
    """How many parts of a batch a host search may run at once, each in a
    thread of its own (`beam._search_in_parts`): on a CPU under JAX or
    TensorFlow, one a core this process may use; elsewhere 1.

    XLA's CPU code runs a product of a decoding step's size (256 rows by
    128 by 128) on one core, where PyTorch spreads it over all of them, so
    a compiled step leaves the other cores idle for most of its time; two
    steps run at once, from two threads, use them (JAX's CPU client and
    TensorFlow both run calls of compiled functions concurrently). On a
    GPU the steps would queue on one device, and PyTorch's eager steps
    already use every core: one part there.
    """
    if not xla_on_cpu() or keras.distribution.distribution() is not None:
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity on macOS and Windows)
        return os.cpu_count() or 1


def compiles_steps():
    """Whether the backend compiles a decoding step for each input shape
    (JAX, TensorFlow), so that a search should keep to a few shapes;
    PyTorch runs a step of any shape eagerly at no extra cost."""
    return keras.config.backend() in ("jax", "tensorflow")
