"""Translating in lower precision: int8 weights (Keras's quantization) and
bfloat16 computation, through `quantize`, `from_preset(dtype=...)` and the
command line's --quantize and --dtype."""

import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.layers import SharedTokenEmbedding
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
    assert keras.backend.standardize_dtype(cache[0][0].dtype) == "bfloat16"
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
    float32 variable, so the shared embedding casts it itself), and equal
    the float32 model's to bfloat16's precision."""
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
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"
    expected = to_numpy(reference(inputs))
    error = np.abs(to_numpy(logits).astype("float32") - expected).max()
    assert error < 0.05 * np.abs(expected).max(), error
