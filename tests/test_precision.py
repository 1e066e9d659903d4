"""Translating in lower precision: int8 weights (Keras's quantization) and
bfloat16 computation, through `quantize`, `from_preset(dtype=...)` and the
command line's --quantize and --dtype."""

import types

import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.layers import SharedTokenEmbedding
from keras_transformer.runtime.bfloat16_products import xla_on_cpu
from keras_transformer.models import TransformerSeq2SeqLM

from helpers import once
from helpers import to_numpy

PRESET = "transformer_multi30k_en_de"


def test_quantized_shared_embedding_keeps_its_scaling_and_logits_bias():
    """Keras calls `quantized_call`, not `call`, once a layer is quantized:
    the sqrt(d_model) scaling and the logits bias must hold there too."""
    embedding = SharedTokenEmbedding(vocabulary_size=50, d_model=16, output_bias=True)
    ids = np.array([[1, 5, 7, 49]])
    hidden = np.random.normal(size=(1, 4, 16)).astype("float32")
    embedding(ids)
    embedding.logits_bias.assign(np.linspace(-3, 3, 50).astype("float32"))
    expected_embeddings, expected_logits = to_numpy(embedding(ids)), to_numpy(embedding(hidden, reverse=True))
    embedding.quantize("int8")
    assert keras.backend.standardize_dtype(embedding.embeddings.dtype) == "int8"
    embeddings, logits = to_numpy(embedding(ids)), to_numpy(embedding(hidden, reverse=True))
    # int8 with a scale per row: about 1/254 of each row's largest value.
    assert np.abs(embeddings - expected_embeddings).max() < 0.01 * np.abs(expected_embeddings).max()
    assert np.abs(logits - expected_logits).max() < 0.02 * np.abs(expected_logits).max()


def test_int8_model_translates_like_float32_and_saves_as_int8(tmp_path):
    sentences = [
        "A man is riding a bicycle.",
        "Two dogs are playing in the snow.",
        "A woman in a red coat is walking down the street.",
        "Children are playing soccer on a field.",
    ]
    model = TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False)  # one model, quantized
    expected = model.generate(sentences, sampler="greedy")
    model.backbone.save_weights(str(tmp_path / "float32.weights.h5"))
    model.quantize("int8")
    kernels = [v for v in model.backbone.weights if v.path.endswith(("kernel", "embeddings"))]
    assert kernels and all(keras.backend.standardize_dtype(v.dtype) == "int8" for v in kernels)
    quantized = model.generate(sentences, sampler="greedy")
    assert sum(a == b for a, b in zip(quantized, expected)) >= 3, (quantized, expected)
    model.save_to_preset(str(tmp_path / "int8"))
    restored = TransformerSeq2SeqLM.from_preset(str(tmp_path / "int8"))
    assert restored.generate(sentences, sampler="greedy") == quantized
    # About a quarter of the float32 weights (int8 values, a float32 scale per channel).
    float32_size = (tmp_path / "float32.weights.h5").stat().st_size
    assert (tmp_path / "int8" / "model.weights.h5").stat().st_size < 0.3 * float32_size


def test_bfloat16_model_computes_in_bfloat16_and_translates_like_float32():
    model = TransformerSeq2SeqLM.from_preset(PRESET, dtype="bfloat16")
    assert model.backbone.compute_dtype == "bfloat16"
    cache = model.empty_self_attention_cache(2, 8)
    # (On TensorFlow's CPU the cache holds the bfloat16 numbers' bits: `runtime.cache_bits`.)
    bits = keras.config.backend() == "tensorflow" and xla_on_cpu()
    assert keras.backend.standardize_dtype(cache[0][0].dtype) == ("uint16" if bits else "bfloat16")
    assert model.generate("A man is riding a bicycle.") == "Ein Mann fährt Fahrrad."


@once
@pytest.mark.parametrize(
    "flags", [["--quantize", "int8"], ["--dtype", "bfloat16"], ["--dtype", "bfloat16", "--quantize", "int8"]]
)
def test_translate_command_takes_precision_flags(flags, capsys):
    cli.main(["translate", *flags, "A man is riding a bicycle."])
    assert capsys.readouterr().out == "Ein Mann fährt Fahrrad.\n"
    with pytest.raises(SystemExit):
        cli.main(["translate", "--dtype", "int3", "A dog."])


def test_mixed_precision_output_projection_multiplies_in_bfloat16():
    """Under mixed_bfloat16 the logits come from a bfloat16 product, as every
    other projection's output does (Keras' `Embedding` does not autocast its
    float32 variable, so the shared embedding casts it itself), are float32
    (as the model's output spec says; on TensorFlow and PyTorch the
    bfloat16 product's values, on JAX its float32 sums), and equal the
    float32 model's to bfloat16's precision."""
    from keras_transformer.models import TransformerBackbone

    config = dict(vocabulary_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=2, max_sequence_length=16)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 64, (2, 6)).astype("int32")
    inputs = {
        "encoder_token_ids": ids,
        "encoder_padding_mask": np.ones_like(ids),
        "decoder_token_ids": ids[:, ::-1].copy(),
        "decoder_padding_mask": np.ones_like(ids),
    }
    keras.utils.set_random_seed(1)
    mixed = TransformerSeq2SeqLM(TransformerBackbone(**config, dtype="mixed_bfloat16"))
    reference = TransformerSeq2SeqLM(TransformerBackbone(**config))
    reference.set_weights(mixed.get_weights())
    logits = mixed(inputs)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert keras.backend.standardize_dtype(mixed.output.dtype) == "float32"
    if keras.config.backend() != "jax":
        import ml_dtypes

        # Values of a bfloat16 product (JAX's products into float32 are
        # covered by the gradient tests below).
        values = to_numpy(logits)
        np.testing.assert_array_equal(values.astype(ml_dtypes.bfloat16).astype("float32"), values)
    expected = to_numpy(reference(inputs))
    error = np.abs(to_numpy(logits).astype("float32") - expected).max()
    assert error < 0.05 * np.abs(expected).max(), error


def test_compiled_bfloat16_projections_multiply_into_float32_on_xla():
    """In functions compiled for decoding on a CPU (`bfloat16_products.xla_decoding`),
    JAX and TensorFlow multiply bfloat16 inputs by bfloat16 kernels into
    float32 (XLA's fast bfloat16 product; into bfloat16 it converts both
    operands to float32 first): the compiled code has such products, and
    the layers' outputs are NumPy's float32 products of the same values,
    plus the bias, rounded once to bfloat16; the output projection gives
    float32 logits."""

    import ml_dtypes

    from keras_transformer.runtime.compiled import compile_for_inference
    from keras_transformer.runtime.direct_layers import Dense
    from keras_transformer.runtime.direct_layers import EinsumDense

    keras.utils.set_random_seed(3)
    inner = Dense(24, activation="relu", dtype="bfloat16")
    heads = EinsumDense("btd,dnh->btnh", (None, 3, 4), bias_axes="nh", dtype="bfloat16")
    merge = EinsumDense("btnh,nhd->btd", (None, 8), bias_axes="d", dtype="bfloat16")
    embedding = SharedTokenEmbedding(vocabulary_size=40, d_model=8, dtype="bfloat16")
    x = keras.ops.cast(np.random.default_rng(0).normal(size=(2, 5, 8)), "bfloat16")
    for layer in (inner, heads, merge, embedding):
        layer.build((2, 5, 3, 4) if layer is merge else (2, 5, 8))
    for layer in (inner, heads, merge):  # (non-zero biases)
        layer.bias.assign(np.random.default_rng(1).normal(size=layer.bias.shape))

    def function(x):
        return inner(x), heads(x), merge(keras.ops.reshape(heads(x), (2, 5, 3, 4))), embedding(x, reverse=True)

    model = types.SimpleNamespace(variables=[v for layer in (inner, heads, merge, embedding) for v in layer.variables])
    compiled = compile_for_inference(model, function)
    outputs = [to_numpy(keras.ops.cast(y, "float32")) for y in compiled(x)]

    def values(tensor):
        return to_numpy(keras.ops.cast(tensor, "float32")).astype("float64")

    def rounded(product):
        return product.astype("float32").astype(ml_dtypes.bfloat16).astype("float32")

    xs = values(x)
    projected = rounded(np.einsum("btd,dnh->btnh", xs, values(heads.kernel)) + values(heads.bias))
    expected = [
        np.maximum(rounded(xs @ values(inner.kernel) + values(inner.bias)), 0),
        projected,
        rounded(np.einsum("btnh,nhd->btd", projected, values(merge.kernel)) + values(merge.bias)),
        xs @ values(embedding.embeddings).T,
    ]
    for got, want in zip(outputs, expected):
        # (One bfloat16 step apart at most, where float32 sums in another order round to the other side.)
        np.testing.assert_allclose(got, want, rtol=2**-7, atol=1e-6)
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        compiled(x)  # (the functions traced inside the context; traced again here to read them)
        from keras_transformer.runtime.bfloat16_products import xla_decoding

        with xla_decoding():
            text = str(jax.make_jaxpr(function)(x))
        assert text.count("preferred_element_type=float32") >= 5, text
    elif backend == "tensorflow":
        import tensorflow as tf

        from keras_transformer.runtime.bfloat16_products import xla_decoding

        with xla_decoding():
            graph = tf.function(function, jit_compile=True).get_concrete_function(x).graph
        products = [op for op in graph.get_operations() if op.type == "BatchMatMulV3"]
        assert len(products) >= 5 and all(op.get_attr("Tout") == tf.float32 for op in products)
        # The float32 logits of the output projection.
        assert outputs[3].dtype == np.float32 and compiled(x)[3].dtype == tf.float32


@pytest.mark.skipif(keras.config.backend() == "torch", reason="XLA's compiled decoding (PyTorch's: test_direct_calls.py)")
@pytest.mark.parametrize("bfloat16_instructions", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_int8_projections_are_keras_int8_products(dtype, bfloat16_instructions, monkeypatch):
    """In functions compiled for decoding on a CPU, the int8 layers
    (`quantize("int8")`) multiply their quantized inputs by their int8
    kernels as a bfloat16 product into float32 on a processor with
    bfloat16 instructions and as a float32 product without
    (`bfloat16_products.int8_product_in_float32`), and give Keras' own int8
    results bit for bit: the same function compiled with Keras' int8
    product (XLA's int8 product into int32) gives the same outputs. Among
    the layers, one of the most inputs the float32 sums hold exactly
    (1,040), at its worst case: every product +127 x +127."""
    from keras_transformer.runtime.compiled import compile_for_inference
    from keras_transformer.runtime import direct_layers
    from keras_transformer.layers import embedding as embedding_module
    from keras_transformer.runtime.bfloat16_products import EXACT_INT8_INPUTS
    from keras_transformer.runtime.bfloat16_products import int8_product_in_float32
    from keras_transformer.runtime.direct_layers import Dense
    from keras_transformer.runtime.direct_layers import EinsumDense
    from keras_transformer.utils.memory import one_garbage_collection
    from keras_transformer.utils import processor

    keras.utils.set_random_seed(4)
    rng = np.random.default_rng(0)
    inner = Dense(24, activation="relu", dtype=dtype)
    heads = EinsumDense("btd,dnh->btnh", (None, 3, 4), bias_axes="nh", dtype=dtype)
    merge = EinsumDense("btnh,nhd->btd", (None, 8), bias_axes="d", dtype=dtype)
    embedding = SharedTokenEmbedding(vocabulary_size=40, d_model=8, dtype=dtype)
    wide = Dense(6, dtype=dtype)
    layers = (inner, heads, merge, embedding, wide)
    for layer in layers:
        layer.build({merge: (2, 5, 3, 4), wide: (2, 5, EXACT_INT8_INPUTS)}.get(layer, (2, 5, 8)))
    for layer in (inner, heads, merge):  # (non-zero biases)
        layer.bias.assign(rng.normal(size=layer.bias.shape))
    signs = rng.choice([-1.0, 1.0], size=EXACT_INT8_INPUTS)
    kernel = rng.normal(size=(EXACT_INT8_INPUTS, 6))
    kernel[:, 0] = 3.0 * signs  # (quantized to +-127, the column's largest)
    wide.kernel.assign(kernel)
    # (One garbage collection for all, as `TransformerSeq2SeqLM.quantize`
    # does: Keras collects after each variable that quantization replaces,
    # 5 s of full collections in a test process holding TensorFlow and a
    # backend.)
    with one_garbage_collection():
        for layer in layers:
            layer.quantize("int8")
    x = keras.ops.cast(rng.normal(size=(2, 5, 8)), dtype)
    extreme = keras.ops.cast(np.broadcast_to(2.0 * signs, (2, 5, EXACT_INT8_INPUTS)), dtype)

    def function(x, extreme):
        return (
            inner(x), heads(x), merge(keras.ops.reshape(heads(x), (2, 5, 3, 4))), embedding(x, reverse=True),
            wide(extreme),
        )

    kernels = set()  # the shapes of the kernels multiplied so

    def counted(quantized, kernel, *args, **kwargs):
        kernels.add(tuple(kernel.shape))
        return int8_product_in_float32(quantized, kernel, *args, **kwargs)

    model = types.SimpleNamespace(variables=[v for layer in layers for v in layer.variables])
    monkeypatch.setattr(processor, "has_bfloat16_products", lambda: bfloat16_instructions)
    monkeypatch.setattr(direct_layers, "int8_product_in_float32", counted)
    monkeypatch.setattr(embedding_module, "int8_product_in_float32", counted)
    outputs = [to_numpy(keras.ops.cast(y, "float32")) for y in compile_for_inference(model, function)(x, extreme)]
    # Every layer's product took it (the output projection's kernel is the embeddings' transpose).
    assert kernels == {(8, 24), (8, 3, 4), (3, 4, 8), (8, 40), (EXACT_INT8_INPUTS, 6)}, kernels
    # Keras' own int8 calls, compiled alike.
    monkeypatch.setattr(direct_layers, "int8_products_in_float32", lambda *args: False)
    monkeypatch.setattr(embedding_module, "int8_products_in_float32", lambda *args: False)
    expected = [to_numpy(keras.ops.cast(y, "float32")) for y in compile_for_inference(model, function)(x, extreme)]
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(got, want)
    # The worst case: 1,040 products of 127 x 127 (2**24 is 16,777,216).
    scale = float(to_numpy(wide.kernel_scale)[0]) * 127 / 2.0
    assert outputs[4][0, 0, 0] * scale == pytest.approx(EXACT_INT8_INPUTS * 127**2, rel=2**-7)


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's bfloat16 products and their gradient")
def test_mixed_precision_gradients_on_jax_are_bfloat16_products_into_float32():
    """Training in mixed_bfloat16 on JAX (CPU), every projection and its
    two gradient products multiply bfloat16 operands into float32
    (`bfloat16_products.bfloat16_product`: into bfloat16, or with a float32
    operand, XLA's CPU code multiplies at its float32 rate). The gradients
    are NumPy's float64 products of the same bfloat16 values, rounded to
    bfloat16: the output's gradient rounded first, as Keras' mixed
    precision rounds it."""
    import jax
    import ml_dtypes

    from keras_transformer.runtime.direct_layers import Dense
    from keras_transformer.runtime.direct_layers import EinsumDense

    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(0)
    layers = [
        Dense(24, dtype="mixed_bfloat16"),
        EinsumDense("btnh,nhd->btd", (None, 8), bias_axes="d", dtype="mixed_bfloat16"),
        SharedTokenEmbedding(vocabulary_size=40, d_model=8, dtype="mixed_bfloat16"),
        Dense(8, dtype="mixed_bfloat16"),  # (a wide input: 600 contracted)
    ]
    shapes = [(2, 5, 8), (2, 5, 3, 4), (2, 5, 8), (2, 5, 600)]

    def bf16(values):
        return np.asarray(values, "float32").astype(ml_dtypes.bfloat16).astype("float64")

    for layer, shape in zip(layers, shapes):
        reverse = isinstance(layer, SharedTokenEmbedding)
        model = keras.Sequential([keras.Input(shape[1:]), layer]) if not reverse else None
        if reverse:
            layer.build()
        x = rng.normal(size=shape).astype("float32")
        kernel = layer.embeddings if reverse else layer.kernel
        weights = [v.value for v in layer.trainable_variables]
        out_shape = (2, 5, 40) if reverse else (2, 5, layer.units if hasattr(layer, "units") else 8)
        upstream = rng.normal(size=out_shape).astype("float32")

        def loss(weights, x):
            if reverse:
                with keras.StatelessScope(list(zip(layer.trainable_variables, weights))):
                    outputs = layer(x, reverse=True)
            else:
                outputs, _ = model.stateless_call(weights, [], x)
            # (Mixed precision's logits are float32.)
            assert keras.backend.standardize_dtype(outputs.dtype) == ("float32" if reverse else "bfloat16")
            return keras.ops.sum(keras.ops.cast(outputs, "float32") * upstream)

        gradient = jax.grad(loss, argnums=(0, 1))(weights, x)
        products = _products(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(weights, x).jaxpr)
        # The forward product and the two of its gradient.
        assert [operands for operands, _ in products] == [("bfloat16", "bfloat16")] * 3, products
        assert all(result == "float32" for _, result in products), products

        xs, g = bf16(x), bf16(upstream)
        w = bf16(keras.ops.convert_to_numpy(kernel.value))
        if reverse:
            w = w.T  # the embeddings' product as a (d_model, vocabulary) kernel
        size = int(np.prod(w.shape[: xs.ndim - 2]))  # the contracted axes: all of x's but (batch, time)
        x_rows, w_matrix, g_rows = xs.reshape(10, size), w.reshape(size, -1), g.reshape(10, -1)
        expected_x = bf16(g_rows @ w_matrix.T).reshape(shape)
        expected_kernel = bf16(x_rows.T @ g_rows).reshape(w.shape)
        if reverse:
            expected_kernel = expected_kernel.T
        got_kernel = keras.ops.convert_to_numpy(gradient[0][0])
        # (One bfloat16 step apart at most, where float32 sums in another order round to the other side.)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(gradient[1]), expected_x, rtol=2**-7, atol=1e-6)
        np.testing.assert_allclose(got_kernel, expected_kernel, rtol=2**-7, atol=1e-6)


def _products(jaxpr):
    """The `dot_general` equations of a jaxpr (and the jaxprs inside it):
    `((operand dtypes), result dtype)` each."""
    found = []
    for equation in jaxpr.eqns:
        if equation.primitive.name == "dot_general":
            operands = tuple(str(variable.aval.dtype) for variable in equation.invars)
            found.append((operands, str(equation.outvars[0].aval.dtype)))
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(inner, "jaxpr", inner)  # (a closed jaxpr's own)
                if hasattr(inner, "eqns"):
                    found.extend(_products(inner))
    return found


@pytest.mark.skipif(keras.config.backend() != "jax", reason="XLA's compiled products on JAX")
def test_compiled_mixed_precision_gradients_keep_bfloat16_operands():
    """XLA's CPU compiler runs a bfloat16 product into float32 at its fast
    rate only in some layouts, and converts the operands of the others to
    float32 (`bfloat16_products._jax_bfloat16_product`). In the compiled
    gradient of a feed-forward network's two layers (rows 512, d_model
    256, d_ff 1,024, each gradient product in the layout it would be in
    without a copy), every product still multiplies bfloat16 operands."""
    import re

    import jax

    from keras_transformer.runtime.direct_layers import Dense

    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((256,)), Dense(1024, activation="relu", dtype="mixed_bfloat16"), Dense(256, dtype="mixed_bfloat16")]
    )
    weights = [v.value for v in model.trainable_variables]
    x = np.random.default_rng(0).normal(size=(512, 256)).astype("float32")

    def loss(weights, x):
        outputs, _ = model.stateless_call(weights, [], x)
        return keras.ops.sum(keras.ops.cast(outputs, "float32") ** 2)

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(weights, x).compile().as_text()
    kinds = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))  # every instruction's element type
    products = re.findall(r"= \w+\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", text)
    assert len(products) >= 6, text  # two forward, four gradient
    assert all((kinds[a], kinds[b]) == ("bf16", "bf16") for a, b in products), [
        (kinds[a], kinds[b]) for a, b in products
    ]
