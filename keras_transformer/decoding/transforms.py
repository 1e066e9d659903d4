"""Per-step transforms of the next-token logits, before the search ranks
them: the one seam where a step's choices are shaped (as transformers'
`LogitsProcessor`s).

Every path of the search (the host search a step a call, its compiled
segments, the compiled loop, ensembles and the SavedModel) ranks a step's
candidates through `candidates` (`search.py` and `interface.py` call it),
so a transform added to `step_transforms` applies to all of them.

A transform is `transform(logits, index, ops)`: `(rows,
vocabulary_size)` float32 logits (or log-probabilities) at output position
`index` (a scalar: a Python int or a tensor), in the namespace `ops` of
`keras_transformer.runtime.array_ops`; it returns logits of the same shape.
"""

import functools

import numpy as np

from keras_transformer.decoding.rules import best_extensions
from keras_transformer.decoding.sampling import sampled_extensions
from keras_transformer.decoding.sampling import sampling_transforms
from keras_transformer.runtime.array_ops import array_ops


def forced_prefix(prefix):
    """The transform that forces the token ids `prefix` at the first
    `len(prefix)` output positions: every other token's logit is `-inf`
    there, and the forced token's 0, so that its log-probability is 0 (the
    output's score is that of the tokens after the prefix, as with
    transformers' `forced_bos_token_id`).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer.runtime.array_ops import KERAS_OPS
    >>> logits = np.zeros((1, 4), "float32")
    >>> transform = forced_prefix((2,))
    >>> ops.convert_to_numpy(transform(logits, 0, KERAS_OPS)).tolist()
    [[-inf, -inf, 0.0, -inf]]
    >>> ops.convert_to_numpy(transform(logits, 1, KERAS_OPS)).tolist()  # past the prefix
    [[0.0, 0.0, 0.0, 0.0]]
    """
    prefix = np.asarray(prefix, "int32")

    def transform(logits, index, ops):
        vocabulary_size = ops.shape(logits)[1]
        forced_ids = ops.convert_to_tensor(prefix, "int32")
        at = ops.minimum(index, len(prefix) - 1)
        token = ops.take(forced_ids, ops.reshape(ops.cast(at, "int32"), (1,)), axis=0)
        forced = ops.where(ops.arange(vocabulary_size, dtype="int32")[None, :] == token[:, None], 0.0, float("-inf"))
        return ops.where(ops.cast(index, "int32") < len(prefix), ops.cast(forced, "float32"), ops.cast(logits, "float32"))

    return transform


@functools.lru_cache(maxsize=256)
def step_transforms(settings):
    """The transforms that `settings` (a `DecodingSettings`) asks for,
    in the order they apply."""
    transforms = sampling_transforms(settings)
    if settings.target_prefix:
        transforms.append(forced_prefix(settings.target_prefix))
    return tuple(transforms)


def candidates(logits, log_probs, index, never_output, settings, keys=None):
    """Rule 2 of the search (`rules.py`) after the step's transforms: the
    `2 * beam_size` best one-token extensions of each source's beams,
    `(values, flat indices)` as `rules.best_extensions` gives them; where
    `settings.sampling` asks for it, a draw first (`sampling.py`).

    Args:
        logits: `(rows, vocabulary_size)` next-token logits (the beams of
            a source consecutive rows).
        log_probs: `(sources, beams)` float32, the beams' log-probabilities.
        index: the output position the logits are for.
        never_output: `rules.never_output_bias` of the model.
        settings: the search's `DecodingSettings`.
        keys: where `settings.sampling`, the sources' `sampling.source_keys`.
    """
    transforms = step_transforms(settings)
    if settings.sampling is not None:
        # (The tokens never output leave before a top-k or top-p cut.)
        ops = array_ops(logits)
        logits = ops.cast(logits, "float32") + ops.convert_to_tensor(never_output, "float32")
    if transforms:
        ops = array_ops(logits)
        for transform in transforms:
            logits = transform(logits, index, ops)
    if settings.sampling is not None:
        return sampled_extensions(logits, log_probs, index, settings, keys)
    return best_extensions(logits, log_probs, never_output, 2 * settings.beam_size)
