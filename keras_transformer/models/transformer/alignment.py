"""Word alignment from a model's encoder-decoder attention: which source
words each word of a translation came from, for carrying inline markup
(`<b>`, `<a>`) from a sentence into its translation
(`documents.inline`).

The translation is fed to the decoder (teacher forcing, one batch of
pairs at a time) and each target token is aligned with the source token
that the encoder-decoder attention of the step predicting it, averaged
over heads and layers, weighs most (as fairseq's `--print-alignment`
reads attention). On five Multi30k sentences translated by the shipped
English-German model, 25 of 26 content words aligned with their source
word this way; 22 with the average of the steps that predict and that
read a token, and 16 to 25 with one layer alone. An alignment is
`mutual` where the source token also weighs that target token most of
all (the intersection of both directions, as symmetrized word alignments
start from): a function word that the attention gives to the next content
word (`auf einem` of `auf einem Fahrrad` for `bicycle`) is not mutual.
A source token that no target token is aligned with still names the
target token it weighs most (the other direction alone), so that every
source word has a place in the translation.

Tokens are matched to the characters they cover in the text (SentencePiece
pieces without their `▁`, WordPiece pieces without their `##`); special
tokens and pieces that do not spell their text (byte fallback) cover none
and align with nothing.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding.beam import round_up
from keras_transformer.runtime.compiled import compiles_steps
from keras_transformer.utils.text import is_blank

# Pairs aligned in one forward pass: at most this many, and at most this
# many (pairs) x (source tokens) x (target tokens) (the attention weights
# of a layer and head: 64 Multi30k sentences take about 64 x 20 x 20;
# 64 sentences of the model's 256 tokens would hold gigabytes). 64
# Multi30k sentences on PyTorch (2 cores): 0.17 s 16 at a time, 0.10 s all
# at once.
ALIGNMENT_BATCH_SIZE = 64
ALIGNMENT_BATCH_CELLS = 64 * 48 * 48
# Where the backend compiles each operation for each shape (JAX and
# TensorFlow, run eagerly here), a pass's token lengths are padded to a
# multiple of this and its pairs to 8 or `ALIGNMENT_BATCH_SIZE`, so that
# passes share a few shapes: on JAX, 64 Multi30k sentences took 1.4-5.8 s
# the first time their shapes came and 0.13-0.19 s again.
SHAPE_MULTIPLE = 32
FEW_PAIRS = 8


def alignments(model, sources, targets, target_prefix=None, batch_size=ALIGNMENT_BATCH_SIZE):
    """For each pair of `sources[i]` and its translation `targets[i]`, the
    target's tokens with the source token each came from.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor.
        sources: source texts, as `generate` read them (for a multilingual
            model, with their language's code).
        targets: their translations (strings).
        target_prefix: token ids that the translations were forced to
            start with (a multilingual model's target language), or None.
        batch_size: the most pairs a forward pass (fewer where they are
            long: `ALIGNMENT_BATCH_CELLS`).

    Returns:
        One list a pair of `(target_start, target_end, source_start,
        source_end, ways)`: a target token's characters in `targets[i]`
        and those of a source token in `sources[i]`; `ways` 2 where each
        weighs the other most (mutual), 1 where the target token came from
        that source token but the source token weighs another target token
        more, 0 (one entry for each source token that no target token
        came from) where the source token weighs that target token most
        and the target token came from another. Empty for a blank source or
        target.
    """
    if len(sources) != len(targets):
        raise ValueError(f"Got {len(sources)} sources and {len(targets)} translations; give one of each a pair.")
    preprocessor, prefix = model.preprocessor, list(target_prefix or [])
    kept = [i for i, (s, t) in enumerate(zip(sources, targets)) if not (is_blank(s) or is_blank(t))]
    results = [[] for _ in sources]
    if not kept:
        return results
    source_ids = preprocessor.generate_preprocess([sources[i] for i in kept], model.backbone.max_sequence_length)
    target_ids = [_decoder_inputs(preprocessor, targets[i], prefix) for i in kept]
    for batch in _batches([(len(s), len(t)) for s, t in zip(source_ids, target_ids)], batch_size):
        weights = _cross_attention(model.backbone, [source_ids[n] for n in batch], [target_ids[n] for n in batch])
        for row, n in enumerate(batch):
            i = kept[n]
            results[i] = _pair_alignment(model.preprocessor.tokenizer, sources[i], targets[i], source_ids[n],
                                         target_ids[n][1 + len(prefix):], weights[row, len(prefix):])
    return results


def _batches(lengths, batch_size):
    """The pairs (indices, in order) of each forward pass: up to
    `batch_size`, and up to `ALIGNMENT_BATCH_CELLS` attention weights.

    >>> _batches([(20, 20)] * 3 + [(300, 300), (30, 30)], batch_size=2)
    [[0, 1], [2], [3], [4]]
    """
    batches, batch, longest = [], [], (0, 0)
    for n, (source, target) in enumerate(lengths):
        wider = (max(longest[0], source), max(longest[1], target))
        if batch and (len(batch) == batch_size or (len(batch) + 1) * wider[0] * wider[1] > ALIGNMENT_BATCH_CELLS):
            batches.append(batch)
            batch, wider = [], (source, target)
        batch.append(n)
        longest = wider
    return batches + [batch] if batch else batches


def _pair_alignment(tokenizer, source, target, source_ids, pieces, weights):
    """One pair's alignment (`alignments`) from its attention weights
    (`weights`: a row for each step from the one predicting the first of
    the target's `pieces`, a column for each of `source_ids`)."""
    source_spans = token_spans(source, [tokenizer.id_to_token(int(t)) for t in source_ids])
    target_spans = token_spans(target, [tokenizer.id_to_token(int(t)) for t in pieces])
    readable = [j for j, span in enumerate(source_spans) if span is not None]
    spelled = [k for k, span in enumerate(target_spans) if span is not None]
    if not readable or not spelled:
        return []
    scores = weights[np.ix_(spelled, readable)]
    sources_of, targets_of = scores.argmax(axis=1), scores.argmax(axis=0)
    found = []
    for n, k in enumerate(spelled):
        j = int(sources_of[n])
        found.append((*target_spans[k], *source_spans[readable[j]], 2 if targets_of[j] == n else 1))
    for j in sorted(set(range(len(readable))) - {int(j) for j in sources_of}):
        found.append((*target_spans[spelled[int(targets_of[j])]], *source_spans[readable[j]], 0))
    return found


def _decoder_inputs(preprocessor, target, prefix):
    """The decoder's inputs for `target`: the start id, the forced
    prefix, the target's tokens."""
    framed = preprocessor.decoder_inputs(target)
    return [framed[0], *prefix, *framed[1:]]


def _cross_attention(backbone, source_ids, target_ids):
    """The encoder-decoder attention of each pair, averaged over layers
    and heads: `(pairs, target steps, source tokens)`, float32 (with rows
    and positions of padding where shapes are kept to a few)."""
    if compiles_steps():
        few = len(source_ids) <= FEW_PAIRS
        multiple, rows = SHAPE_MULTIPLE, FEW_PAIRS if few else max(len(source_ids), ALIGNMENT_BATCH_SIZE)
    else:
        multiple, rows = 1, len(source_ids)
    encoder_ids, encoder_mask = _padded(source_ids, multiple, rows, backbone.max_sequence_length)
    decoder_ids, decoder_mask = _padded(target_ids, multiple, rows, backbone.max_sequence_length)
    encoded = backbone.encode(encoder_ids, encoder_mask)
    _, scores = backbone.decode(decoder_ids, encoded, decoder_padding_mask=decoder_mask,
                                encoder_padding_mask=encoder_mask, return_attention_scores=True)
    layers = [ops.convert_to_numpy(ops.cast(layer["cross_attention"], "float32")) for layer in scores]
    return np.mean([layer.mean(axis=1) for layer in layers], axis=0)


def _padded(id_lists, multiple, rows, limit):
    """`(ids, mask)` of `rows` rows (those after `id_lists`' a position of
    padding each), as wide as the longest rounded up to `multiple`, at
    most `limit`."""
    longest = max(map(len, id_lists))
    width = min(round_up(longest, multiple), max(limit, longest))
    ids = np.zeros((rows, width), "int32")
    mask = np.zeros((rows, width), "int32")
    mask[:, 0] = 1  # (a padding row attends somewhere)
    for row, found in enumerate(id_lists):
        ids[row, : len(found)] = found
        mask[row, : len(found)] = 1
    return ids, mask


def token_spans(text, pieces):
    """The characters `[start, end)` of `text` that each token piece
    spells, in order; None for a piece that spells none (a special token,
    a byte, an unknown piece).

    >>> token_spans("A big dog.", ["<s>", "▁A", "▁big", "▁do", "g", ".", "</s>"])
    [None, (0, 1), (2, 5), (6, 8), (8, 9), (9, 10), None]
    """
    spans, cursor = [], 0
    for piece in pieces:
        surface = _surface(str(piece))
        found = text.find(surface, cursor) if surface else -1
        # (a piece spells the text at the cursor, after whitespace at most)
        if found < 0 or text[cursor:found].strip():
            spans.append(None)
            continue
        spans.append((found, found + len(surface)))
        cursor = found + len(surface)
    return spans


def _surface(piece):
    """The characters a token piece spells: SentencePiece's `▁` is a space
    (dropped), WordPiece's `##` a word's continuation; special tokens
    (`<s>`, `<0xE2>`, `[CLS]`, `__de__`) spell none."""
    if (piece.startswith("<") and piece.endswith(">")) or (piece.startswith("[") and piece.endswith("]")):
        return ""
    if piece.startswith("__") and piece.endswith("__") and len(piece) > 4:
        return ""
    return piece.removeprefix("##").replace("▁", " ").strip()
