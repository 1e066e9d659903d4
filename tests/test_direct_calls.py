"""Direct layer calls (`keras_transformer.runtime.direct_calls`), which
decoding uses on PyTorch: the numbers of Keras' full `Layer.__call__`,
without its work on each call."""

import contextlib

import keras
import numpy as np
import pytest

from keras_transformer.decoding import beam_search
from keras_transformer.runtime.direct_calls import direct_calls
from keras_transformer.models import TransformerBackbone
from keras_transformer.models import TransformerSeq2SeqLM

from helpers import to_numpy

VOCABULARY = 40
SOURCES = np.array([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]], "int32")
TARGET_PREFIX = [[1, 1], [11, 12], [13, 2]]  # tokens of both rows, a step each


def _model(variant):
    keras.utils.set_random_seed(0)  # the same weights at every run
    overrides = {
        # d_k != d_v: attention through equation (1), not the fused kernel.
        "pre_norm_and_value_dim": dict(normalize_first=True, key_dim=8, value_dim=16),
        "learned_positions_and_bias": dict(position_encoding="learned", output_bias=True),
        "bfloat16": dict(dtype="bfloat16"),
        "mixed_bfloat16": dict(dtype="mixed_bfloat16"),
    }.get(variant, {})
    backbone = TransformerBackbone(
        VOCABULARY, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.1, max_sequence_length=32,
        **overrides,
    )
    model = TransformerSeq2SeqLM(backbone)
    # Every matrix its own values, of its scale: a layer's projections start
    # as one matrix (docs/paper_map.md), where keys and values swapped, say,
    # would give the same logits.
    rng = np.random.default_rng(0)
    model.set_weights(
        [rng.normal(0, float(np.std(w)) or 0.1, w.shape).astype(w.dtype) if w.ndim >= 2 else w
         for w in model.get_weights()]
    )
    if variant in ("int8", "int4"):
        model.quantize(variant)
    if variant == "int8_partial":
        # Some projections int8, their neighbours float: the self-attention's
        # query (not its key and value) and the feed-forward's inner layer.
        model.quantize("int8", filters=lambda layer: layer.name in ("query", "inner"))
    if variant == "learned_positions_and_bias":
        model.backbone.token_embedding.logits_bias.assign(np.linspace(-2, 2, VOCABULARY).astype("float32"))
    return model


def _cached_steps(model, sources=SOURCES, prefix=TARGET_PREFIX, return_cache=False):
    """The logits of three cached decoding steps, as the searches run them
    (and the cache after them)."""
    mask = sources != 0
    cross = model.cross_attention_cache(model.encode(sources, mask))
    cache = list(zip(model.empty_self_attention_cache(len(sources), 8), cross))
    logits = []
    for index, tokens in enumerate(prefix):
        step_logits, cache = model.call_decoder_with_cache(np.array(tokens, "int32")[:, None], index, cache, mask)
        logits.append(to_numpy(keras.ops.cast(step_logits, "float32")))
    return (np.stack(logits), cache) if return_cache else np.stack(logits)


def _tolerance(dtype):
    """Direct calls against Keras calls: equal, but for the rounding of
    PyTorch's fused calls (see `direct_layers.Dense`)."""
    if keras.config.backend() != "torch":
        return dict(rtol=0, atol=0)
    if "bfloat16" in dtype:
        # Two bfloat16 computations: over ten random models, each path's
        # logits were up to 0.02-0.045 from float32's (mean 0.004-0.011), and
        # up to 0.039 from each other.
        return dict(rtol=2e-2, atol=5e-2)
    return dict(rtol=1e-5, atol=1e-5)


@pytest.fixture
def layer_calls(monkeypatch):
    """The class names of the layers that go through `Layer.__call__`."""
    calls = []
    original = keras.layers.Layer.__call__

    def counting(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", counting)
    return calls


# Direct calls serve PyTorch; their Keras side is the same on every backend
# and runs in TensorFlow's run too, but on JAX each eager op compiles (75 s).
not_on_jax = pytest.mark.skipif(keras.config.backend() == "jax", reason="runs in PyTorch's and TensorFlow's runs")


@not_on_jax
@pytest.mark.parametrize(
    "variant",
    ["float32", "pre_norm_and_value_dim", "learned_positions_and_bias", "bfloat16", "int8", "int4", "mixed_bfloat16"],
)
def test_direct_calls_give_the_logits_of_keras_calls(variant, layer_calls):
    model = _model(variant)
    layer_calls.clear()
    expected = _cached_steps(model)
    keras_calls = list(layer_calls)
    layer_calls.clear()
    with direct_calls():
        direct = _cached_steps(model)
    # On PyTorch the projections and LayerNorms are one PyTorch call each
    # (`linear`, `layer_norm`), which round differently from Keras' einsum
    # and bias add.
    np.testing.assert_allclose(direct, expected, **_tolerance(variant))
    assert np.abs(expected).max() > 0.1 and np.isfinite(expected).all()
    # Every layer of a step is called directly, mixed precision included
    # (its input casts and autocast scopes as `Layer.__call__` makes them).
    assert len(keras_calls) > 50
    assert layer_calls == []


@not_on_jax
def test_direct_calls_end_with_their_context_and_stay_in_their_thread(layer_calls):
    import threading

    model = _model("float32")
    expected = _cached_steps(model)
    layer_calls.clear()
    in_thread = []
    with direct_calls():
        worker = threading.Thread(target=lambda: in_thread.append(_cached_steps(model)))
        worker.start()
        worker.join()
    np.testing.assert_array_equal(in_thread[0], expected)
    assert len(layer_calls) > 50  # the other thread called through Keras
    layer_calls.clear()
    with pytest.raises(RuntimeError):
        with direct_calls():
            with direct_calls():
                pass
            assert _cached_steps(model).shape == expected.shape and layer_calls == []  # still direct
            raise RuntimeError("leaves the context")
    _cached_steps(model)
    assert len(layer_calls) > 50


@pytest.mark.parametrize("layer_dtype", ["float32", "mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("scope_dtype", [None, "bfloat16", "float32"])
def test_direct_calls_cast_and_scope_as_keras_calls(layer_dtype, scope_dtype, layer_calls):
    """Inside another layer's autocast scope, or none, a layer called
    directly gets the input casts and the scope of `Layer.__call__`: a
    float32 layer computes in float32 inside a bfloat16 scope, a mixed one
    in bfloat16 with its float32 weights, from float32 inputs."""
    from keras.src.backend import AutocastScope

    from keras_transformer.runtime.direct_layers import Dense

    layer = Dense(8, dtype=layer_dtype)
    # A layer without mixed dtypes is given inputs of its dtype (the
    # contract of `direct_calls()`); a mixed one casts them itself.
    x = keras.ops.cast(np.random.normal(size=(3, 16)), "bfloat16" if layer_dtype == "bfloat16" else "float32")
    layer(x)
    scope = AutocastScope(scope_dtype) if scope_dtype else contextlib.nullcontext()
    with scope:
        expected = layer(x)
    layer_calls.clear()
    with scope, direct_calls():
        direct = layer(x)
    assert layer_calls == []
    assert keras.backend.standardize_dtype(direct.dtype) == keras.backend.standardize_dtype(expected.dtype)
    np.testing.assert_array_equal(to_numpy(keras.ops.cast(direct, "float32")), to_numpy(keras.ops.cast(expected, "float32")))


@pytest.mark.skipif(keras.config.backend() != "torch", reason="training steps call layers directly on PyTorch only")
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_training_steps_on_pytorch_call_layers_directly(dtype, layer_calls, monkeypatch):
    """`fit`'s steps on PyTorch run inside `direct_calls()`: the same losses
    and weights as through `Layer.__call__`, with dropout on."""
    from keras_transformer.models.transformer import seq2seq_lm

    rng = np.random.default_rng(0)
    x = {
        "encoder_token_ids": rng.integers(4, VOCABULARY, (4, 7)).astype("int32"),
        "encoder_padding_mask": np.ones((4, 7), "int32"),
        "decoder_token_ids": rng.integers(4, VOCABULARY, (4, 5)).astype("int32"),
        "decoder_padding_mask": np.ones((4, 5), "int32"),
    }
    y = rng.integers(4, VOCABULARY, (4, 5)).astype("int32")

    def train(model):
        losses = [float(model.train_on_batch(x, y)[0]) for _ in range(3)]
        return losses, model.backbone.get_weights()

    keras.utils.set_random_seed(3)
    model = _model(dtype)
    model.compile()
    model.train_on_batch(x, y)  # builds the step's state
    keras.utils.set_random_seed(4)
    layer_calls.clear()
    with monkeypatch.context() as keras_calls:
        keras_calls.setattr(seq2seq_lm, "direct_calls_where_eager", contextlib.nullcontext)
        expected_losses, expected_weights = train(model)
    assert len(layer_calls) > 3 * 50

    keras.utils.set_random_seed(3)
    model = _model(dtype)
    model.compile()
    model.train_on_batch(x, y)
    keras.utils.set_random_seed(4)
    layer_calls.clear()
    losses, weights = train(model)
    # Only the task and its functional backbone go through `Layer.__call__`.
    assert len(layer_calls) <= 3 * 2, sorted(set(layer_calls))
    assert len(set(losses)) == 3
    np.testing.assert_allclose(losses, expected_losses, **_tolerance(dtype))
    for got, want in zip(weights, expected_weights):
        np.testing.assert_allclose(got, want, **_tolerance(dtype))


@pytest.mark.skipif(keras.config.backend() != "torch", reason="decoding calls layers directly on PyTorch only")
def test_beam_search_on_pytorch_calls_no_layer_through_keras(layer_calls, monkeypatch):
    import contextlib

    from keras_transformer.runtime import compiled

    model = _model("float32")
    sources = [SOURCES[0, :5].tolist(), SOURCES[1, :3].tolist()]
    with monkeypatch.context() as keras_calls:
        keras_calls.setattr(compiled, "direct_calls", contextlib.nullcontext)
        expected = beam_search(model, sources, beam_size=3, num_results=2, max_length_offset=6)
    assert len(layer_calls) > 100
    layer_calls.clear()
    direct = beam_search(model, sources, beam_size=3, num_results=2, max_length_offset=6)
    assert layer_calls == []
    assert len({tuple(ids) for result in expected for ids, _, _ in result}) > 1
    for got, want in zip(direct, expected):
        assert [ids for ids, _, _ in got] == [ids for ids, _, _ in want]
        np.testing.assert_allclose([score for _, score, _ in got], [score for _, score, _ in want], rtol=1e-6)


only_torch = pytest.mark.skipif(keras.config.backend() != "torch", reason="the plain PyTorch step is PyTorch's")


# The decoder's variants, and whether a cached step of each runs as plain
# PyTorch calls (`torch_decoding_step`): all but mixed precision.
DECODING_STEP_VARIANTS = [
    ("float32", True),
    ("pre_norm_and_value_dim", True),
    ("learned_positions_and_bias", True),
    ("bfloat16", True),
    ("int8", True),
    ("int8_partial", True),
    ("mixed_bfloat16", False),
]


@only_torch
@pytest.mark.parametrize("variant, plain", DECODING_STEP_VARIANTS)
def test_decoding_steps_run_the_plain_pytorch_step_where_it_applies(variant, plain, monkeypatch):
    """Inside `direct_calls()` a decoder layer's cached step is
    `torch_decoding_step.decoding_step` (float weights computing in their
    dtype, or Keras' int8 weights), and Keras' calls otherwise; both give the logits of Keras'
    `Layer.__call__` (`test_direct_calls_give_the_logits_of_keras_calls`
    checks the numbers of every variant)."""
    from keras_transformer.runtime import torch_layer_calls

    model = _model(variant)
    expected = _cached_steps(model)
    direct, steps = _direct_steps_recording(model, monkeypatch, torch_layer_calls, "decoding_step", 3)
    np.testing.assert_allclose(direct, expected, **_tolerance(variant))
    # 2 layers, 3 steps: positions 0, 1, 2 in each.
    assert steps == ([0, 0, 1, 1, 2, 2] if plain else [])


def _direct_steps_recording(model, monkeypatch, module, name, position_argument):
    """`_cached_steps(model)` within `direct_calls()`, with the positions
    that `module.name` was called with (its argument `position_argument`),
    sorted."""
    positions = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args: positions.append(args[position_argument]) or original(*args))
    with direct_calls():
        return _cached_steps(model), sorted(positions)


@only_torch
@pytest.mark.parametrize(
    "variant, plain",
    [
        ("float32", True),
        ("pre_norm_and_value_dim", True),
        ("bfloat16", True),
        ("int8", True),
        ("int8_partial", True),
        ("mixed_bfloat16", False),
    ],
)
def test_encoder_layers_run_the_plain_pytorch_step_without_gradients(variant, plain, monkeypatch):
    """Inside `direct_calls()` and without gradients (as a translation
    encodes), an encoder layer is `torch_decoding_step.encoding_step`, with
    Keras' outputs at every position, padded sources included; with
    gradients (whose joined projection the step would not pass on), it
    runs `call`."""
    import torch

    from keras_transformer.runtime import torch_layer_calls as encoder

    model = _model(variant)
    mask = SOURCES != 0
    as_float = lambda x: to_numpy(keras.ops.cast(x, "float32"))  # noqa: E731
    expected = as_float(model.encode(SOURCES, mask))  # Keras' calls
    steps = []
    original = encoder.encoding_step
    monkeypatch.setattr(encoder, "encoding_step", lambda *args: steps.append(args[2].shape) or original(*args))
    with direct_calls():
        with_gradients = model.encode(SOURCES, mask)
        assert not steps
        with torch.no_grad():
            without = model.encode(SOURCES, mask)
    assert len(steps) == (2 if plain else 0)
    assert with_gradients.requires_grad
    # In bfloat16, LayerNorm outputs of up to about 3 differ by up to two
    # of their units in the last place (1/64 above 2).
    tolerance = dict(rtol=2e-2, atol=4e-2) if variant == "bfloat16" else _tolerance(variant)
    np.testing.assert_allclose(as_float(with_gradients), expected, **tolerance)
    np.testing.assert_allclose(as_float(without), expected, **tolerance)
    # The padding mask matters: the second source's outputs differ with
    # its padding read as tokens.
    with direct_calls(), torch.no_grad():
        unmasked = as_float(model.encode(SOURCES, np.ones_like(mask)))
    assert np.abs(unmasked[1, :4] - expected[1, :4]).max() > 1e-3


@only_torch
@pytest.mark.parametrize("variant, plain", DECODING_STEP_VARIANTS)
def test_search_steps_run_the_decoder_stack_as_plain_pytorch_calls(variant, plain, monkeypatch):
    """Within a search (`unchanged_weights()`), a cached step of the
    backbone is `torch_decoding_step.decoder_step`: the embedding, each
    layer's plain step and the final norm called in a row, none of them
    through `Layer.__call__` or a direct call's dispatch, with Keras'
    logits; in mixed precision, the layers' own calls. So are the encoder
    output's keys and values for the decoder layers
    (`torch_decoding_step.cross_attention_cache`)."""
    from keras_transformer.runtime import dispatch as direct_module
    from keras_transformer.runtime.direct_calls import unchanged_weights
    from keras_transformer.models.transformer import backbone as backbone_module

    model = _model(variant)
    expected = _cached_steps(model)
    stepped, dispatched, crossed = [], [], []
    original_step = backbone_module.decoder_step
    monkeypatch.setattr(
        backbone_module, "decoder_step", lambda *args: stepped.append(args[2]) or original_step(*args)
    )
    original_cross = backbone_module.cross_attention_cache

    def cross_attention_cache(*args):
        caches = original_cross(*args)
        crossed.append(caches is not None)
        return caches

    monkeypatch.setattr(backbone_module, "cross_attention_cache", cross_attention_cache)
    original_call = direct_module.DirectCall.__call__
    monkeypatch.setattr(
        direct_module.DirectCall, "__call__",
        lambda self, *args, **kwargs: dispatched.append(type(self).__name__) or original_call(self, *args, **kwargs),
    )
    with direct_calls(), unchanged_weights():
        direct = _cached_steps(model)
    np.testing.assert_allclose(direct, expected, **_tolerance(variant))
    assert stepped == [0, 1, 2] and crossed == [plain]
    # Only the output projection of each step is a layer call.
    decoder_layers = [name for name in dispatched if name == "TransformerDecoderLayer"]
    assert len(decoder_layers) == (0 if plain else 6)


@only_torch
@pytest.mark.parametrize("copies, attends_in", [(1, "bfloat16"), (8, "float32")])
def test_bfloat16_search_steps_attend_in_float32_from_16_rows(copies, attends_in):
    """A bfloat16 model's search steps on a CPU attend in float32 from
    `_FLOAT32_ATTENTION_FROM_ROWS` (16) rows up: the caches they return,
    self-attention and encoder-decoder, are float32 there and bfloat16
    below; the logits are Keras' calls' (which attend in bfloat16) within
    bfloat16's rounding, and those of the same weights in float32."""
    import torch

    from keras_transformer.runtime.direct_calls import unchanged_weights
    from keras_transformer.runtime.torch_decoding_step import attention_dtype

    model = _model("bfloat16")
    float32 = _model("float32")  # the same random weights, unrounded
    float32.set_weights([keras.ops.convert_to_numpy(keras.ops.cast(w, "float32")) for w in model.weights])
    sources, prefix = np.tile(SOURCES, (copies, 1)), [tokens * copies for tokens in TARGET_PREFIX]
    assert attention_dtype(torch.zeros(len(sources), 1, 8, dtype=torch.bfloat16)) == getattr(torch, attends_in)
    expected = _cached_steps(model, sources, prefix)
    with torch.inference_mode(), direct_calls(), unchanged_weights():
        direct, cache = _cached_steps(model, sources, prefix, return_cache=True)
    for self_cache, cross_cache in cache:
        assert {t.dtype for t in (*self_cache, *cross_cache)} == {getattr(torch, attends_in)}
    np.testing.assert_allclose(direct, expected, **_tolerance("bfloat16"))
    np.testing.assert_allclose(direct, _cached_steps(float32, sources, prefix), **_tolerance("bfloat16"))


@only_torch
def test_search_steps_read_the_weights_as_each_search_starts():
    """What a search's steps hold of the weights is checked once a search
    (`unchanged_weights()`), so weights written between two searches are
    the second one's."""
    import torch

    from keras_transformer.runtime.direct_calls import unchanged_weights

    model = _model("float32")
    # (In inference mode, as a search runs: the output projection of a few
    # rows reads a copy of the embeddings, `_torch_projection_columns`.)
    with torch.inference_mode(), direct_calls(), unchanged_weights():
        before = _cached_steps(model)
    layer = model.backbone.decoder_layers[1]
    layer.set_weights([w * 1.5 for w in layer.get_weights()])
    embeddings = model.backbone.token_embedding.embeddings
    embeddings.assign(keras.ops.convert_to_numpy(embeddings) * 0.5)
    expected = _cached_steps(model)
    with torch.inference_mode(), direct_calls(), unchanged_weights():
        direct = _cached_steps(model)
    assert np.abs(expected - before).max() > 0.1
    np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-5)


@only_torch
def test_training_after_a_search_records_gradients():
    """A search runs in PyTorch's inference mode; what it leaves on the
    layers for later calls (the sinusoid table) is a plain tensor, so a
    training step after it records gradients through them."""
    import torch

    model = _model("float32")
    beam_search(model, [SOURCES[0, :5].tolist()], beam_size=2, max_length_offset=4)
    table = model.backbone.decoder_position.__dict__["_torch_table"]
    assert not table.is_inference()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    inputs = {
        "encoder_token_ids": SOURCES, "encoder_padding_mask": SOURCES != 0,
        "decoder_token_ids": SOURCES, "decoder_padding_mask": SOURCES != 0,
    }
    before = [w.copy() for w in model.get_weights()]
    targets = np.roll(SOURCES, -1, axis=1)
    # (Validation runs the encoder's plain step, whose weights the search made.)
    history = model.fit(inputs, targets, validation_data=(inputs, targets), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    assert any(np.abs(a - b).max() > 0 for a, b in zip(model.get_weights(), before))
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


@only_torch
def test_plain_pytorch_step_reads_weights_changed_after_it_ran():
    """The step's matrices (the self-attention's three projections joined
    into one, a copy) follow the layers' weights: written in place
    (`assign`, `set_weights`), and with LoRA enabled on a projection (then
    Keras' calls run)."""
    model = _model("float32")
    with direct_calls():
        before = _cached_steps(model)
    rng = np.random.default_rng(5)
    layer = model.backbone.decoder_layers[0]
    kernel = layer.self_attention.value_dense.kernel
    kernel.assign(rng.normal(size=kernel.shape).astype("float32"))
    weights = model.backbone.decoder_layers[1].get_weights()
    model.backbone.decoder_layers[1].set_weights([w * 1.5 for w in weights])
    expected = _cached_steps(model)
    with direct_calls():
        direct = _cached_steps(model)
    assert np.abs(expected - before).max() > 0.1
    np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-5)

    layer.cross_attention.query_dense.enable_lora(2, b_initializer="random_normal")
    expected = _cached_steps(model)
    with direct_calls():
        direct = _cached_steps(model)
    assert np.abs(expected - before).max() > 0.1
    np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-5)


@only_torch
def test_prepacked_bfloat16_products_follow_the_weights():
    """bfloat16 decoding on a CPU with bfloat16 matrix units multiplies with
    weights prepacked once (`int8_products.prepacked_product`): the decoder
    layers' products and the output projection give Keras' logits, and
    again after the embeddings and a projection are written in place."""
    import torch

    from keras_transformer.runtime import int8_products as module

    weight, bias = torch.randn(24, 16).bfloat16(), torch.randn(24).bfloat16()
    product = module.prepacked_product(weight)
    if product is None:
        pytest.skip("this CPU has no bfloat16 matrix units that oneDNN uses")
    assert module.prepacked_product(weight.float()) is None  # float32 stays with `linear`
    x = torch.randn(5, 1, 16).bfloat16()
    with torch.no_grad():
        packed = product(x, bias)
    np.testing.assert_allclose(
        packed.float().numpy(), torch.nn.functional.linear(x, weight, bias).float().numpy(), rtol=2e-2, atol=2e-2
    )

    model = _model("bfloat16")
    made = []
    original = module.prepacked_product
    with pytest.MonkeyPatch.context() as patch:
        from keras_transformer.runtime import torch_layer_calls as embedding
        from keras_transformer.runtime import torch_step_weights as torch_decoding_step

        def counting(*args):
            made.append(tuple(args[0].shape))
            return original(*args)

        patch.setattr(embedding, "prepacked_product", counting)
        patch.setattr(torch_decoding_step, "prepacked_product", counting)
        with direct_calls(), torch.no_grad():  # as decoding runs
            before = _cached_steps(model)
        # Each decoder layer's seven products (its encoder-decoder keys and
        # values one of them), each encoder layer's four, and the output
        # projection.
        assert len(made) == 2 * 7 + 2 * 4 + 1 and (VOCABULARY, model.backbone.d_model) in made
        # New weights of the same scale: other tokens' embeddings, a
        # larger feed-forward kernel.
        embeddings = model.backbone.token_embedding.embeddings
        embeddings.assign(np.roll(to_numpy(keras.ops.cast(embeddings, "float32")), 1, axis=0))
        kernel = model.backbone.decoder_layers[1].feed_forward.inner_dense.kernel
        kernel.assign(to_numpy(keras.ops.cast(kernel, "float32")) * 1.5)
        expected = _cached_steps(model)
        with direct_calls(), torch.no_grad():
            direct = _cached_steps(model)
    # Made again for the new weights: the second decoder layer's and the
    # output projection's (the other layers' weights stayed as they were).
    assert len(made) == (2 * 7 + 2 * 4 + 1) + (7 + 1)
    assert np.abs(expected - before).max() > 0.1
    np.testing.assert_allclose(direct, expected, **_tolerance("bfloat16"))


@only_torch
@pytest.mark.parametrize("rows", [1, 4, 64])
def test_prepacked_bfloat16_products_of_any_rows_are_their_rounded_products(rows):
    """A prepacked bfloat16 product, whether oneDNN's (many rows) or the
    float32 product of the same values (a few rows, small matrices), is
    the exact product of its bfloat16 inputs and weights, plus the bias,
    rounded to bfloat16: within a bfloat16 rounding of NumPy's float64."""
    import torch

    from keras_transformer.runtime import int8_products as module

    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(384, 128, generator=generator).bfloat16()
    bias = torch.randn(384, generator=generator).bfloat16()
    product = module.prepacked_product(weight)
    if product is None:
        pytest.skip("this CPU has no bfloat16 matrix units that oneDNN uses")
    x = torch.randn(rows, 1, 128, generator=generator).bfloat16()
    # (1 and 4 rows take the float32 product, 64 rows oneDNN's.)
    assert (x.numel() * 384 <= module._FLOAT32_PRODUCT) == (rows < 64)
    with torch.no_grad():
        outputs = product(x, bias)
    assert outputs.dtype == torch.bfloat16 and tuple(outputs.shape) == (rows, 1, 384)
    expected = x.double().numpy() @ weight.double().numpy().T + bias.double().numpy()
    np.testing.assert_allclose(outputs.double().numpy(), expected, rtol=2**-8, atol=1e-6)


@only_torch
@pytest.mark.parametrize("rows", [1, 4, 64])
def test_prepacked_float32_products_are_linear_products(rows):
    """Where large float32 products are prepacked in oneDNN (AMD
    processors, `int8_products._float32_products_prepacked`), a product of a
    matrix of at least `_PREPACKED_FLOAT32_WEIGHTS` entries is `linear`'s:
    within float32 rounding of NumPy's float64 product, at any number of
    rows, and through `linear` (with a gradient) where gradients are
    recorded; smaller matrices, and processors where it is off, keep
    `linear` (no packed product)."""
    import torch

    from keras_transformer.runtime import int8_products as module

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch has no oneDNN")
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(512, 256, generator=generator)
    bias = torch.randn(512, generator=generator)
    assert weight.numel() >= module._PREPACKED_FLOAT32_WEIGHTS > 384 * 128
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_float32_products_prepacked", lambda: False)
        assert module.prepacked_product(weight) is None
        patch.setattr(module, "_float32_products_prepacked", lambda: True)
        assert module.prepacked_product(torch.randn(384, 128)) is None  # a decoder layer's of d_model 128
        product = module.prepacked_product(weight)
    x = torch.randn(rows, 1, 256, generator=generator)
    with torch.no_grad():
        outputs = product(x, bias)
    assert outputs.dtype == torch.float32 and tuple(outputs.shape) == (rows, 1, 512)
    expected = x.double().numpy() @ weight.double().numpy().T + bias.double().numpy()
    np.testing.assert_allclose(outputs.numpy(), expected, rtol=1e-5, atol=1e-4)
    leaf = x.clone().requires_grad_()
    product(leaf, bias).sum().backward()
    np.testing.assert_allclose(leaf.grad.numpy()[:, 0], np.broadcast_to(weight.sum(0).numpy(), (rows, 256)), rtol=1e-5, atol=1e-4)


@only_torch
def test_prepacked_float32_products_follow_the_weights():
    """With every float32 product prepacked (the threshold lowered to this
    small model's matrices), cached decoding steps give Keras' logits, and
    again after the embeddings and a projection are written in place: the
    packed copies are made again for the new weights."""
    import torch

    from keras_transformer.runtime import int8_products as module

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch has no oneDNN")
    model = _model("float32")
    made = []
    original = module.prepacked_product
    with pytest.MonkeyPatch.context() as patch:
        from keras_transformer.runtime import torch_layer_calls as embedding
        from keras_transformer.runtime import torch_step_weights as torch_decoding_step

        def counting(weight):
            product = original(weight)
            made.append(product is not None)
            return product

        patch.setattr(module, "_float32_products_prepacked", lambda: True)
        patch.setattr(module, "_PREPACKED_FLOAT32_WEIGHTS", 1)
        patch.setattr(embedding, "prepacked_product", counting)
        patch.setattr(torch_decoding_step, "prepacked_product", counting)
        expected = _cached_steps(model)
        with direct_calls(), torch.no_grad():  # as decoding runs
            direct = _cached_steps(model)
        # Each decoder layer's seven products (its encoder-decoder keys and
        # values one of them), each encoder layer's four, and the output
        # projection: all packed.
        assert made == [True] * (2 * 7 + 2 * 4 + 1)
        np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-5)
        embeddings = model.backbone.token_embedding.embeddings
        embeddings.assign(np.roll(to_numpy(embeddings), 1, axis=0))
        kernel = model.backbone.decoder_layers[1].feed_forward.inner_dense.kernel
        kernel.assign(to_numpy(kernel) * 1.5)
        new_expected = _cached_steps(model)
        with direct_calls(), torch.no_grad():
            new_direct = _cached_steps(model)
    assert len(made) == (2 * 7 + 2 * 4 + 1) + (7 + 1)
    assert np.abs(new_expected - expected).max() > 0.1
    np.testing.assert_allclose(new_direct, new_expected, rtol=1e-5, atol=1e-5)


@only_torch
def test_sinusoidal_rows_from_the_kept_table_are_the_layers_positions():
    """Within `direct_calls()` the sinusoidal encoding reads its rows from a
    table computed once (and grown past its length): the rows of keras-hub's
    call at any start position."""
    from keras_transformer.layers.position import SinusoidalPositionEncoding

    layer = SinusoidalPositionEncoding()
    x = keras.ops.zeros((2, 3, 16))
    for start in (0, 62, 200, 5):
        expected = to_numpy(layer(x, start_index=start))
        with direct_calls():
            direct = to_numpy(layer(x, start_index=start))
        np.testing.assert_array_equal(direct, expected)
    assert layer._torch_table.shape[0] >= 203


def test_cache_writes_in_place_only_where_the_caller_owns_the_cache():
    """`write_cache` writes into the cache it is given only within both
    `in_place_cache_writes()` and `direct_calls()` on PyTorch; otherwise it
    leaves the given cache as it was and returns `slice_update`'s copy."""
    from keras_transformer.runtime.direct_calls import in_place_cache_writes
    from keras_transformer.runtime.direct_calls import write_cache

    update = keras.ops.ones((2, 1, 1, 3))
    expected = np.zeros((2, 1, 4, 3), "float32")
    expected[:, :, 1] = 1.0
    contexts = {
        "none": [],
        "in place only": [in_place_cache_writes],
        "direct only": [direct_calls],
        "both": [in_place_cache_writes, direct_calls],
    }
    for name, entered in contexts.items():
        cache = keras.ops.zeros((2, 1, 4, 3))
        with contextlib.ExitStack() as stack:
            for context in entered:
                stack.enter_context(context())
            written = write_cache(cache, [0, 0, 1, 0], update)
        np.testing.assert_array_equal(to_numpy(written), expected, err_msg=name)
        in_place = name == "both" and keras.config.backend() == "torch"
        assert (written is cache) == in_place, name
        assert float(to_numpy(cache).sum()) == (6.0 if in_place else 0.0), name


@pytest.mark.parametrize(
    "equation, input_shape, output_shape, bias_axes",
    [
        ("btd,dnh->btnh", (3, 5, 8), (None, 2, 4), "nh"),  # split into heads
        ("btnh,nhd->btd", (3, 5, 2, 4), (None, 8), "d"),  # heads joined
        ("abc,cd->abd", (3, 5, 8), (None, 6), "d"),  # a plain dense layer
        ("btd,dnh->btnh", (3, 5, 8), (None, 2, 4), "h"),  # bias on some output axes: Keras' call
        ("btd,bd->bt", (3, 5, 8), (5,), None),  # not a matrix product: Keras' call
    ],
)
@pytest.mark.parametrize("direct", [False, True])
def test_projections_compute_numpys_einsum(equation, input_shape, output_shape, bias_axes, direct):
    from keras_transformer.runtime.direct_layers import EinsumDense

    layer = EinsumDense(equation, output_shape=output_shape, bias_axes=bias_axes, bias_initializer="random_normal")
    x = np.random.randn(*input_shape).astype("float32")
    layer.build(input_shape)
    kernel, *bias = (to_numpy(w) for w in layer.weights)
    expected = np.einsum(equation, x, kernel) + (bias[0] if bias else 0.0)
    with direct_calls() if direct else contextlib.nullcontext():
        found = to_numpy(layer(keras.ops.convert_to_tensor(x)))
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)
    # One `linear` call where the equation is a product with the bias on
    # the kernel's output axes.
    assert bool(layer._torch_plan()) == (equation != "btd,bd->bt" and bias_axes != "h")


@pytest.mark.parametrize(
    "dtype, mixed_kernel",
    [("float32", True), ("bfloat16", True), ("mixed_bfloat16", True), ("mixed_bfloat16", False)],
    ids=["float32", "bfloat16", "mixed_bfloat16", "mixed_bfloat16-cast-to-float32"],
)
def test_direct_dense_and_layer_norm_compute_numpys(dtype, mixed_kernel, monkeypatch):
    """`Dense` (with its activation) and `LayerNormalization` called
    directly give NumPy's results; a bfloat16 LayerNorm computes in float32,
    as Keras' does (under mixed precision, on PyTorch's CPU, one kernel that
    takes the bfloat16 input and float32 weights; on devices whose kernel
    wants one dtype, CUDA's, the input cast to float32: `mixed_kernel`
    False takes that path here)."""
    from keras_transformer.runtime import direct_layers as module
    from keras_transformer.runtime.direct_layers import Dense
    from keras_transformer.runtime.direct_layers import LayerNormalization

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 16)).astype("float32")
    dense = Dense(8, activation="relu", bias_initializer="random_normal", dtype=dtype)
    norm = LayerNormalization(epsilon=1e-5, gamma_initializer="random_normal", beta_initializer="random_normal", dtype=dtype)
    dense.build(x.shape)
    norm.build(x.shape)
    if not mixed_kernel:
        if keras.config.backend() != "torch":
            pytest.skip("only PyTorch's mixed-precision LayerNorm depends on the device's kernel")
        monkeypatch.setattr(module, "LAYER_NORM_MIXED_DTYPE_DEVICES", ())
    as_float = lambda w: to_numpy(keras.ops.cast(w, "float32"))  # noqa: E731
    inputs = keras.ops.cast(x, norm.compute_dtype)
    x = as_float(inputs)  # the values the layers see
    with direct_calls():
        dense_out, norm_out = (layer(inputs) for layer in (dense, norm))
    assert keras.backend.standardize_dtype(norm_out.dtype) == norm.compute_dtype
    dense_out, norm_out = as_float(dense_out), as_float(norm_out)
    kernel, bias = (as_float(w) for w in dense.weights)
    gamma, beta = (as_float(w) for w in norm.weights)
    normalized = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(dense_out, np.maximum(x @ kernel + bias, 0.0), **tolerance)
    np.testing.assert_allclose(norm_out, normalized * gamma + beta, **tolerance)
    assert (dense_out == 0).any() and (dense_out > 0).any()
    if dtype != "float32":
        # Within one bfloat16 rounding (8 significant bits) of float32's.
        expected = normalized * gamma + beta
        assert np.all(np.abs(norm_out - expected) <= np.abs(expected) * 2.0**-8 + 1e-6)



def test_direct_attention_and_row_take_give_keras_results():
    """`direct_calls.dot_product_attention` and the search's row take
    (`runtime.array_ops`) give Keras' results, a row with every position masked included (a uniform average
    on the CPU, zeros on CUDA; not NaN)."""
    from keras_transformer.runtime.direct_calls import dot_product_attention
    from keras_transformer.runtime.array_ops import array_ops

    rng = np.random.default_rng(1)
    query, key, value = (keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))
                         for shape in [(2, 3, 4, 8), (2, 5, 4, 8), (2, 5, 4, 8)])
    mask = rng.random((2, 1, 3, 5)) > 0.4
    mask[1, 0, 2] = False  # every position masked
    mask = keras.ops.convert_to_tensor(mask)
    expected = to_numpy(keras.ops.dot_product_attention(query, key, value, mask=mask))
    rows = keras.ops.convert_to_tensor(np.array([1, 1, 0], "int32"))
    with direct_calls():
        direct = to_numpy(dot_product_attention(query, key, value, mask))
        taken = to_numpy(array_ops(value).take(value, rows, axis=0))
    np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-6)
    if getattr(getattr(value, "device", None), "type", "cpu") == "cpu":
        np.testing.assert_allclose(direct[1, 2], to_numpy(value)[1].mean(axis=0), rtol=1e-5, atol=1e-6)
    else:  # CUDA's fused kernels give such a row zeros (as Keras' call does: the first check)
        assert np.isfinite(direct[1, 2]).all()
    np.testing.assert_array_equal(taken, to_numpy(value)[[1, 1, 0]])


@pytest.mark.parametrize("axis", [2, -2, 0])
def test_zero_padded_pads_one_axis_with_zeros(axis):
    """The search's `pad_to` (its cache growing by positions,
    `runtime.array_ops`) is NumPy's zero padding of one axis, on every
    backend, in Keras ops and in the backend's own namespace."""
    from keras_transformer.runtime.array_ops import KERAS_OPS
    from keras_transformer.runtime.array_ops import array_ops

    x = np.random.default_rng(2).normal(size=(3, 2, 5, 4)).astype("float32")
    padding = [(0, 0)] * 4
    padding[axis] = (0, 7 - x.shape[axis])
    tensor = keras.ops.convert_to_tensor(x)
    for ops in (KERAS_OPS, array_ops(tensor)):
        np.testing.assert_array_equal(to_numpy(ops.pad_to(tensor, axis, 7)), np.pad(x, padding))


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the int8 products of direct calls are PyTorch's")
def test_int8_layers_multiply_as_int8_with_keras_results():
    """Quantized to int8, the model's projections, feed-forward layers and
    output projection are each one int8 product on PyTorch
    (`int8_products.int8_product`), with the results of Keras' int8 calls;
    in the plain PyTorch decoding step, the self-attention's three
    projections are one int8 product together."""
    from keras_transformer.runtime import direct_layers as module
    from keras_transformer.runtime import torch_layer_calls as embedding
    from keras_transformer.runtime import torch_step_weights as torch_decoding_step
    from keras_transformer.runtime.layer_calls import torch_call_of

    model = _model("int8")
    layers = [layer for layer in model.backbone._flatten_layers() if layer.quantization_mode == "int8"]
    expected = _cached_steps(model)
    products = {"layers": [], "decoding step": []}
    original = module.int8_product

    def counting(kind):
        def count(*args, **kwargs):
            products[kind].append(tuple(args[3].shape))
            return original(*args, **kwargs)

        return count

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "int8_product", counting("layers"))
        patch.setattr(embedding, "int8_product", counting("layers"))
        patch.setattr(torch_decoding_step, "int8_product", counting("decoding step"))
        with direct_calls():
            direct = _cached_steps(model)
    np.testing.assert_allclose(direct, expected, rtol=1e-5, atol=1e-5)
    kinds = {type(layer).__name__ for layer in layers}
    assert {"Dense", "EinsumDense", "SharedTokenEmbedding"} <= kinds
    assert all(torch_call_of(layer) is not None for layer in layers if type(layer).__name__ != "SharedTokenEmbedding")
    # Per step: 2 decoder layers x (the joined self-attention projections,
    # its output, the cross-attention's query and output, 2 feed-forward
    # layers) in the decoding step, and the output projection.
    d_model = model.backbone.d_model
    assert len(products["decoding step"]) == 3 * 2 * 6
    assert products["decoding step"].count((d_model, 3 * d_model)) == 3 * 2
    assert sum(shape == (d_model, VOCABULARY) for shape in products["layers"]) == 3


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the int8 products of direct calls are PyTorch's")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_products_of_a_few_rows_in_float32_are_the_integer_products(dtype):
    """Keras' int8 product of a few rows computed in float32 from the
    kernel's values (`int8_product(..., float_kernel=...)`) is the exact
    integer product, bit for bit, up to the largest input size it is used
    for, where every partial sum is largest (inputs and kernel at +-127),
    for float32 and bfloat16 inputs (a bfloat16 model quantized to int8)."""
    import torch

    from keras_transformer.runtime import int8_products as module

    quantizer = keras.quantizers.AbsMaxQuantizer(axis=-1)
    inputs, outputs = module.EXACT_INT8_INPUTS, 8
    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (inputs, outputs), generator=generator) * 2 - 1
    kernel = torch.randint(-127, 128, (inputs, outputs), generator=generator).to(torch.int8)
    kernel[:, 0] = (127 * signs[:, 0]).to(torch.int8)
    scale = torch.rand(outputs, generator=generator) + 0.5
    x = torch.randn(3, 1, inputs, generator=generator)
    x[:, :, :] = x.abs().amax() * signs[:, 0]  # each row's entries at its extreme, their signs the kernel's
    x = x.to(getattr(torch, dtype))
    assert x.numel() * outputs <= module._FLOAT32_PRODUCT
    with torch.no_grad():
        exact = module.int8_product(quantizer, x, 1, kernel, scale, x.dtype)
        float_kernel = module.exact_float_kernel(kernel)  # (the largest kernel it is made for)
        in_float = module.int8_product(quantizer, x, 1, kernel, scale, x.dtype, float_kernel=float_kernel)
    assert in_float.dtype == x.dtype
    # Column 0 sums products of 127 x 127, all positive: 16,774,160 at
    # 1,040 inputs (2**24 is 16,777,216).
    row_scale = 127 / (float(x.abs().amax()) + quantizer.epsilon)
    rounding = 2**-8 if dtype == "bfloat16" else 1e-5  # (bfloat16 outputs keep 8 bits)
    assert float(exact[0, 0, 0]) * row_scale * float(scale[0]) == pytest.approx(inputs * 127**2, rel=rounding)
    np.testing.assert_array_equal(in_float.float().numpy(), exact.float().numpy())


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the int8 products of direct calls are PyTorch's")
@pytest.mark.parametrize("inputs", [1040, 2100])
def test_int8_products_without_int8_instructions_are_the_integer_products(inputs, monkeypatch):
    """On a processor without int8 dot-product instructions, Keras' int8
    product is float32 products of the quantized values
    (`integer_product_in_float32`): the exact integer product, as
    `torch._int_mm` computes it, bit for bit, where every partial sum is
    largest (inputs and kernel at +-127), also beyond the 1,040 inputs
    that one float32 product sums exactly (2,100: three products added
    as int32)."""
    import torch

    from keras_transformer.runtime import int8_products as module

    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (inputs,), generator=generator) * 2 - 1
    kernel = torch.randint(-127, 128, (inputs, 40), generator=generator).to(torch.int8)
    kernel[:, 0] = (127 * signs).to(torch.int8)
    quantized = torch.randint(-127, 128, (20, inputs), generator=generator).float()
    quantized[0] = 127 * signs  # row 0 by column 0: inputs x 127**2
    exact = torch._int_mm(quantized.to(torch.int8), kernel)
    found = module.integer_product_in_float32(quantized, kernel)
    assert int(exact[0, 0]) == inputs * 127**2
    np.testing.assert_array_equal(found.to(torch.int64).numpy(), exact.numpy())
    # `int8_product` takes either way by the processor's instructions, with the same results.
    quantizer = keras.quantizers.AbsMaxQuantizer(axis=-1)
    x, scale = torch.randn(2, 10, inputs, generator=generator), torch.rand(40, generator=generator) + 0.5
    results = {}
    for int8_instructions in (True, False):
        monkeypatch.setattr(module, "_int8_dot_products", lambda: int8_instructions)
        results[int8_instructions] = module.int8_product(quantizer, x, 1, kernel, scale, x.dtype)
    np.testing.assert_array_equal(results[False].numpy(), results[True].numpy())


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_drops_at_its_rate_and_keeps_the_expectation(rate):
    """The package's `Dropout` (on PyTorch's CPU, its own mask from 16
    random bits an element; on JAX, from XLA's generator): each position is
    dropped at `rate` (the four positions that share a 64-bit draw alike),
    kept values are scaled by one over the keep probability, and the
    gradient is the same mask and scale. The same seed gives the same mask;
    the next call of a layer, another one."""
    from keras_transformer.runtime.direct_layers import Dropout

    keras.utils.set_random_seed(3)
    x = keras.Variable(np.ones((400, 1000), "float32"))
    layer = Dropout(rate)
    if keras.config.backend() == "torch":
        y = layer(x.value, training=True)
        y.sum().backward()
        gradient = to_numpy(x.value.grad)
    elif keras.config.backend() == "jax":
        import jax

        layer.build(x.shape)
        state = layer.seed_generator.state.value

        def masked_sum(value):
            with keras.StatelessScope(state_mapping=[(layer.seed_generator.state, state)]):
                outputs = layer(value, training=True)
            return outputs.sum(), outputs

        (_, y), gradient = jax.value_and_grad(masked_sum, has_aux=True)(x.value)
        gradient = to_numpy(gradient)
    else:
        y, gradient = layer(x, training=True), None
    y = to_numpy(y)
    kept = y != 0
    # 400,000 elements: a drop rate within 0.004 of `rate` (over 6 standard
    # deviations), for each position in a group of four.
    for offset in range(4):
        assert abs(1 - kept.reshape(-1)[offset::4].mean() - rate) < 0.004, offset
    keep = kept.mean()
    np.testing.assert_allclose(y[kept], 1 / (1 - rate), rtol=1e-4)
    assert abs(y.mean() - 1) < 0.01
    if gradient is not None:
        np.testing.assert_array_equal(gradient, y)
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), to_numpy(x))
    seeded = [to_numpy(Dropout(rate, seed=7)(x, training=True)) for _ in range(2)]
    np.testing.assert_array_equal(seeded[0], seeded[1])
    again = Dropout(rate, seed=7)
    again(x, training=True)
    assert (to_numpy(again(x, training=True)) != seeded[0]).any()
    assert 0 < keep < 1


@only_torch
@pytest.mark.parametrize("rows", [4, 32])
@pytest.mark.parametrize("value_depth", [8, 16])
def test_attention_over_a_cache_sees_its_written_positions_only(rows, value_depth):
    """`torch_decoding_step.attend_to_cache`, one query a row over the
    written positions 0 to `index` of a self-attention cache (the fused
    kernel for few rows, the whole cache masked from
    `_MASKED_FROM_ROWS`), is equation (1) in NumPy over those positions,
    whatever the positions after them hold."""
    import torch

    from keras_transformer.runtime.torch_decoding_step import _MASKED_FROM_ROWS
    from keras_transformer.runtime.torch_decoding_step import attend_to_cache

    assert (rows >= _MASKED_FROM_ROWS) == (rows == 32)  # each path once
    heads, length, depth, index = 4, 16, 8, 6
    rng = np.random.default_rng(rows)
    query = rng.normal(size=(rows, heads, 1, depth)).astype("float32")
    keys = rng.normal(size=(rows, heads, length, depth)).astype("float32")
    values = rng.normal(size=(rows, heads, length, value_depth)).astype("float32")
    scores = query @ keys[:, :, : index + 1].transpose(0, 1, 3, 2) / np.sqrt(depth)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ values[:, :, : index + 1]
    with torch.inference_mode():
        attended = attend_to_cache(*(torch.from_numpy(x) for x in (query, keys, values)), index)
    np.testing.assert_allclose(attended.numpy(), expected.reshape(rows * heads, 1, value_depth), rtol=1e-5, atol=1e-5)


@only_torch
@pytest.mark.parametrize("variant", ["float32", "pre_norm_and_value_dim"])
def test_decoding_steps_masking_the_whole_cache_give_keras_logits(variant, monkeypatch):
    """The decoding step with the masked whole-cache attention at any
    number of rows (the test's 2 included) gives Keras' logits."""
    from keras_transformer.runtime import torch_decoding_step

    model = _model(variant)
    expected = _cached_steps(model)
    monkeypatch.setattr(torch_decoding_step, "_MASKED_FROM_ROWS", 1)
    direct, masked = _direct_steps_recording(model, monkeypatch, torch_decoding_step, "_future_mask", 1)
    np.testing.assert_allclose(direct, expected, **_tolerance(variant))
    assert masked == [0, 0, 1, 1, 2, 2]  # 2 layers, 3 steps
