"""Attention maps of a translation, per layer and head, like the paper's
Figures 3-5: encoder self-attention, decoder self-attention and
encoder-decoder (cross) attention.

```python
from keras_transformer.visualization import attention_maps, plot_attention

maps = attention_maps(model, "A man is riding a bicycle.")  # translates greedily
plot_attention(maps, "attention.png")
```
"""

import numpy as np
from keras import ops

from keras_transformer.utils.text import is_blank

KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")


def attention_maps(model, source, target=None):
    """The attention weights of every layer and head for one sentence pair.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor.
        source: the source sentence.
        target: its translation; by default the model's greedy translation.

    Returns:
        A dict with `source_tokens` and `target_tokens` (subword strings:
        the source with `<s>`/`</s>`, the decoder's inputs `<s> y1 ... yn`),
        `target` (the text), `logits` (the model's next-token logits at each
        target position), and for each of `encoder_self_attention` (`(h,
        S, S)`), `decoder_self_attention` (`(h, T, T)`) and
        `cross_attention` (`(h, T, S)`) a list with one float array per
        layer; each row (a query position) sums to 1.
    """
    if model.preprocessor is None:
        raise ValueError("Attention maps need a model with a preprocessor (its tokenizer) to read text.")
    preprocessor = model.preprocessor
    tokenizer = preprocessor.tokenizer
    if is_blank(str(source)):
        raise ValueError("The source text is blank: there is no attention to show.")
    if target is None:
        target = model.generate(source, sampler="greedy", ensemble=[])  # the maps are this model's
    source_ids = preprocessor.generate_preprocess([source], model.backbone.max_sequence_length)[0]
    target_ids = preprocessor.decoder_inputs(target)
    backbone = model.backbone
    encoder_ids = np.array([source_ids], "int32")
    decoder_ids = np.array([target_ids], "int32")
    encoder_mask = np.ones_like(encoder_ids)
    decoder_mask = np.ones_like(decoder_ids)

    x, encoder_scores = backbone.encode(encoder_ids, encoder_mask, return_attention_scores=True)
    y, decoder_scores = backbone.decode(
        decoder_ids, x, decoder_padding_mask=decoder_mask, encoder_padding_mask=encoder_mask,
        return_attention_scores=True,
    )
    maps = {
        "encoder_self_attention": encoder_scores,
        "decoder_self_attention": [scores["self_attention"] for scores in decoder_scores],
        "cross_attention": [scores["cross_attention"] for scores in decoder_scores],
    }

    def pieces(ids):
        return [str(tokenizer.id_to_token(int(i))) for i in ids]

    result = {kind: [ops.convert_to_numpy(w)[0].astype("float32") for w in maps[kind]] for kind in KINDS}
    result.update(
        source_tokens=pieces(source_ids),
        target_tokens=pieces(target_ids),
        target=target,
        logits=ops.convert_to_numpy(backbone.token_embedding(y, reverse=True))[0],
    )
    return result


def plot_attention(maps, path=None, kinds=KINDS, cell_size=0.18):
    """Draws attention maps as a grid: a row per layer of each kind, a
    column per head, tokens on the axes (matplotlib).

    Args:
        maps: from `attention_maps`.
        path: save the figure there (PNG, PDF, SVG...); None returns it
            without saving.
        kinds: which of `encoder_self_attention`, `decoder_self_attention`,
            `cross_attention` to draw.
        cell_size: inches a token takes on an axis.

    Returns:
        The matplotlib `Figure`.
    """
    try:
        # A Figure of its own, not pyplot's: the caller's pyplot backend and
        # figures are left alone, and no display is needed to save.
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("Plotting attention needs matplotlib: pip install matplotlib") from error
    if not kinds:
        raise ValueError(f"No attention kinds to draw; choose from {list(KINDS)}.")
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ValueError(f"Unknown attention kinds {unknown}; choose from {list(KINDS)}.")
    labels = {
        "encoder_self_attention": (maps["source_tokens"], maps["source_tokens"]),
        "decoder_self_attention": (maps["target_tokens"], maps["target_tokens"]),
        "cross_attention": (maps["target_tokens"], maps["source_tokens"]),
    }
    panels = [(kind, layer, weights) for kind in kinds for layer, weights in enumerate(maps[kind])]
    heads = max(w.shape[0] for _, _, w in panels)
    longest = max(len(maps["source_tokens"]), len(maps["target_tokens"]))
    side = max(2.0, cell_size * longest + 1.2)
    figure = Figure(figsize=(side * heads, side * len(panels)))
    axes = figure.subplots(len(panels), heads, squeeze=False)
    for row, (kind, layer, weights) in enumerate(panels):
        queries, keys = labels[kind]
        for head in range(heads):
            axis = axes[row, head]
            axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0)
            axis.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
            axis.set_yticks(range(len(queries)), queries, fontsize=6)
            axis.set_title(f"{kind.replace('_', ' ')}, layer {layer + 1}, head {head + 1}", fontsize=7)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure
