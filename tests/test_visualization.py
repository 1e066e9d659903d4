"""Attention maps (the paper's Figures 3-5) and their plot."""

import numpy as np
import pytest

from keras_transformer.visualization import attention_maps
from keras_transformer.visualization import plot_attention

from helpers import once
from helpers import to_numpy
from test_seq2seq_lm import tiny_model


def test_attention_maps_reproduce_the_forward_pass(small_tokenizer):
    model = tiny_model(small_tokenizer)
    source, target = "Ein Mann fährt Fahrrad.", "A man rides a bike."
    maps = attention_maps(model, source, target)
    S, T = len(maps["source_tokens"]), len(maps["target_tokens"])
    assert maps["source_tokens"][0] == "<s>" and maps["source_tokens"][-1] == "</s>"
    heads = model.backbone.num_heads
    for kind, shape in [("encoder_self_attention", (heads, S, S)), ("decoder_self_attention", (heads, T, T)),
                        ("cross_attention", (heads, T, S))]:
        assert len(maps[kind]) == model.backbone.num_layers
        for weights in maps[kind]:
            assert weights.shape == shape
            np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    # The decoder never attends to later positions.
    for weights in maps["decoder_self_attention"]:
        assert np.abs(np.triu(weights, k=1)).max() == 0.0
    # The maps come from the model's own forward pass: same logits.
    ids = np.array([[small_tokenizer.token_to_id(t) for t in maps["target_tokens"]]], "int32")
    source_ids = np.array([[small_tokenizer.token_to_id(t) for t in maps["source_tokens"]]], "int32")
    logits = to_numpy(model({
        "encoder_token_ids": source_ids, "encoder_padding_mask": np.ones_like(source_ids),
        "decoder_token_ids": ids, "decoder_padding_mask": np.ones_like(ids),
    }))[0]
    np.testing.assert_allclose(maps["logits"], logits, atol=1e-4)


@once
def test_plot_attention_writes_a_picture(small_tokenizer, tmp_path):
    pytest.importorskip("matplotlib")
    model = tiny_model(small_tokenizer)
    maps = attention_maps(model, "Ein Hund läuft.")  # greedy translation
    assert isinstance(maps["target"], str)
    path = tmp_path / "attention.png"
    import matplotlib

    backend = matplotlib.get_backend()
    figure = plot_attention(maps, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The caller's pyplot is left as it was.
    assert matplotlib.get_backend() == backend
    layers = model.backbone.num_layers
    assert len(figure.axes) == 3 * layers * model.backbone.num_heads
    with pytest.raises(ValueError, match="Unknown attention kinds"):
        plot_attention(maps, kinds=["encoder"])
    with pytest.raises(ValueError, match="No attention kinds"):
        plot_attention(maps, kinds=[])
    with pytest.raises(ValueError, match="The source text is blank: there is no attention to show"):
        attention_maps(model, "  ")
