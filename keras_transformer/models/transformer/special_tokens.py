"""The special token ids of a vocabulary, read in one place.

Models trained by this package use `<pad>` 0, `<unk>` 1, `<s>` 2 and `</s>`
3, frame sources as `<s> ... </s>` and start decoding from `<s>`. Imported
checkpoints differ: a Marian (opus-mt) model ends sentences with id 0, pads
with the last id, starts decoding from the padding id and gives sources no
start token. Everything that frames, pads or decodes reads the ids from
`special_token_ids(tokenizer)`, never from constants.
"""

from typing import NamedTuple

# The ids of the tokenizers this package trains (`TransformerTokenizer`).
DEFAULT_PAD_ID, DEFAULT_UNK_ID, DEFAULT_START_ID, DEFAULT_END_ID = 0, 1, 2, 3


class SpecialTokenIds(NamedTuple):
    """The special ids of a vocabulary.

    Attributes:
        pad: the padding id (never an output).
        start: the first decoder input of every target (never an output
            unless it is also `end`).
        end: the id that ends a sequence.
        unk: the id of unknown pieces, or None.
        source_start: the id put before every source, or None for sources
            framed as `... </s>` only.
    """

    pad: int
    start: int
    end: int
    unk: int | None
    source_start: int | None

    @property
    def never_output(self):
        """The ids that decoding never outputs: padding and start."""
        return sorted({self.pad, self.start} - {self.end})

    def frame_source(self, ids):
        """A source's piece ids as the encoder reads them."""
        prefix = [] if self.source_start is None else [self.source_start]
        return [*prefix, *ids, self.end]

    def frame_target(self, ids):
        """A target's piece ids as teacher forcing reads them: `start`,
        the pieces, `end` (inputs are all but the last, labels all but the
        first)."""
        return [self.start, *ids, self.end]


DEFAULT_SPECIAL_TOKEN_IDS = SpecialTokenIds(
    pad=DEFAULT_PAD_ID,
    start=DEFAULT_START_ID,
    end=DEFAULT_END_ID,
    unk=DEFAULT_UNK_ID,
    source_start=DEFAULT_START_ID,
)


def special_token_ids(tokenizer):
    """The `SpecialTokenIds` of a tokenizer (the package's defaults for None).

    A tokenizer gives `pad_token_id`, `start_token_id`, `end_token_id` and
    optionally `unk_token_id` and `source_start_token_id` (the start id
    when absent, as in the package's own tokenizers).

    Example:

    >>> special_token_ids(None)
    SpecialTokenIds(pad=0, start=2, end=3, unk=1, source_start=2)
    """
    if tokenizer is None or getattr(tokenizer, "pad_token_id", None) is None:
        # No tokenizer, or one whose vocabulary is not loaded yet (keras-hub
        # builds a preset's task before it loads the tokenizer's assets;
        # `PresetIO.from_preset` compiles it again after).
        return DEFAULT_SPECIAL_TOKEN_IDS
    start = tokenizer.start_token_id
    return SpecialTokenIds(
        pad=tokenizer.pad_token_id,
        start=start,
        end=tokenizer.end_token_id,
        unk=getattr(tokenizer, "unk_token_id", None),
        source_start=getattr(tokenizer, "source_start_token_id", start),
    )
