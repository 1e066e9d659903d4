"""The one rule for text a model is given: `generate`'s sources, and the
sentence pairs held in memory that `fit`, `evaluate` and `predict` take,
are checked alike (each text a string or UTF-8 bytes, Unicode throughout,
no longer than the sequences the model reads), before anything goes into
`tf.data`, whose traceback would bury the message."""

import numpy as np

# What `fit`, `evaluate` and `predict` do with sentence pairs longer than
# the preprocessor's sequence lengths (their `long_pairs` argument).
LONG_PAIRS = ("error", "drop", "truncate")


def text_list(inputs, accepted):
    """`(texts, single)`: the strings of `inputs` (a string, bytes, or a
    list, array or string tensor of them), and whether `inputs` was one
    text; `accepted` says what the caller takes, for the errors."""
    if hasattr(inputs, "numpy"):  # a tf.Tensor of strings
        inputs = inputs.numpy()
    if isinstance(inputs, np.ndarray):
        inputs = inputs.item() if inputs.ndim == 0 else inputs.tolist()
    single = isinstance(inputs, (str, bytes))
    if not single and (inputs is None or not hasattr(inputs, "__iter__") or isinstance(inputs, dict)):
        raise TypeError(f"{accepted}; got {type(inputs).__name__}: {inputs!r:.60}.")
    texts = [inputs] if single else list(inputs)
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                texts[i] = text = text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"Text {i} is not valid UTF-8 (byte {text[error.start]:#04x} at offset {error.start}): "
                    "decode it with the right encoding first, or pass str."
                ) from None
        elif not isinstance(text, str):
            nested = " (one string a sentence: a flat list, not a list of lists)" if isinstance(
                text, (list, tuple, np.ndarray)) else ""
            raise TypeError(f"{accepted}; item {i} is of type {type(text).__name__}{nested}: {text!r:.60}.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            # Lone surrogates: bytes that were not UTF-8, decoded with
            # Python's "surrogateescape" (as sys.argv and some files are).
            raise ValueError(
                f"Text {i} holds {text[error.start]!r} at character {error.start}, which is not a Unicode "
                "character (a lone surrogate: bytes that were not UTF-8, decoded with 'surrogateescape'). "
                "Decode the text with its real encoding."
            ) from None
    return texts, single


def too_long(kind, long, total, limit, tokens, text, advice):
    """The error for the `long` (indices) of `total` texts (`kind`:
    "source", "pair") that exceed `limit` (such as "the model's
    max_sequence_length=48"): their count, and the first one's `tokens`
    (its token count, said as "60 tokens") and `text`.

    >>> print(too_long("source", [3], 10, "the model's max_sequence_length=48", "60 tokens", "A dog", "Split it."))
    A source of 60 tokens is longer than the model's max_sequence_length=48: 'A dog'... Split it.
    """
    if len(long) == 1:
        what = f"A {kind} of {tokens} is longer than {limit}"
    else:
        what = f"{len(long)} of {total} {kind}s are longer than {limit}; the first, {kind} {long[0]}, has {tokens}"
    return ValueError(f"{what}: {text[:60]!r}... {advice}")


def check_pair_texts(preprocessor, x, long_pairs="error"):
    """The sentence pairs `x` (a dict with `encoder_text` and
    `decoder_text`) checked by the rule of `text_list`, not empty, and no
    longer than `preprocessor`'s sequence lengths, or else as `long_pairs`
    says: `"drop"` leaves them out, `"truncate"` lets the packers cut them.

    Returns:
        `(x, kept)`: the pairs to use, and the indices of those kept (None
        when all are).
    """
    if long_pairs not in LONG_PAIRS:
        raise ValueError(f"long_pairs must be one of {LONG_PAIRS}, got {long_pairs!r}.")
    texts = {}
    for key in ("encoder_text", "decoder_text"):
        accepted = f"{key} takes a string or a list of strings (one a sentence)"
        try:
            texts[key], single = text_list(x[key], accepted)
        except ValueError as error:
            raise ValueError(f"{key}: {error}") from None
    sources, targets = texts["encoder_text"], texts["decoder_text"]
    if not sources:
        raise ValueError("The data holds no sentence pairs (encoder_text is empty): give at least one pair.")
    if long_pairs == "truncate":
        return x, None
    source_lengths = [len(ids) for ids in preprocessor.generate_preprocess(sources)]
    target_lengths = [len(ids) + 2 for ids in preprocessor.target_token_ids(targets)]  # start and end
    # A target feeds the decoder all but its last token, and labels all but its first.
    source_limit, target_limit = preprocessor.encoder_sequence_length, preprocessor.decoder_sequence_length + 1
    long = {i for i, length in enumerate(source_lengths) if length > source_limit}
    long |= {i for i, length in enumerate(target_lengths) if length > target_limit}
    if not long:
        return x, None
    if long_pairs == "drop":
        kept = [i for i in range(len(sources)) if i not in long]
        if not kept:
            raise ValueError(f"All {len(sources)} pairs are longer than the preprocessor's sequence lengths: "
                             "long_pairs='drop' leaves none. Raise the sequence lengths.")
        return {**x, "encoder_text": [sources[i] for i in kept], "decoder_text": [targets[i] for i in kept]}, kept
    long = sorted(long)
    first = long[0]
    error = too_long(
        "pair", long, len(sources),
        f"the preprocessor's sequence lengths (encoder_sequence_length={preprocessor.encoder_sequence_length}, "
        f"decoder_sequence_length={preprocessor.decoder_sequence_length}, start and end tokens included)",
        f"{source_lengths[first]} source and {target_lengths[first] - 1} target tokens", sources[first],
        "Split them into sentences, build the preprocessor with longer sequence lengths (up to the model's "
        "max_sequence_length), or pass long_pairs='drop' to leave them out (long_pairs='truncate' cuts them).",
    )
    raise error

