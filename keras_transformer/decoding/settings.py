"""Decoding settings, held and checked in one place (paper section 6.1).

`DecodingSettings` is to this package what transformers' `GenerationConfig`
is to theirs: every setting of a search (beam size, length penalty, output
budget, n-best, a forced target prefix), checked once when it is made,
then read by every path that searches (`beam.beam_search`, the compiled
loops, ensembles, the SavedModel). It is frozen and hashable, so compiled
searches are kept by their settings.
"""

import dataclasses

import numpy as np

# "gnmt": the paper's (GNMT's) ((5 + |Y|) / 6) ** alpha; "length": |Y| **
# alpha, as Hugging Face transformers (and Marian) rank hypotheses.
LENGTH_PENALTIES = ("gnmt", "length")
# Sampling instead of the search's ranking (`sampling.py`).
SAMPLINGS = ("top_k", "top_p")


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to search for translations.

    Args:
        beam_size: live hypotheses per source (the paper: 4; 1 is greedy
            decoding).
        alpha: the length penalty's exponent (the paper: 0.6; 0 ranks by
            log-probability alone).
        length_penalty: `"gnmt"` (the paper's, ((5 + |Y|) / 6) ** alpha)
            or `"length"` (|Y| ** alpha, which also stops as transformers'
            beam search does with `early_stopping=False`).
        max_length_offset: at most source length + this many output
            tokens (the paper: 50), within the model's positions. May be
            negative (outputs shorter than their sources).
        num_results: hypotheses returned per source, best first (at most
            `beam_size`).
        target_prefix: token ids that every output starts with, forced at
            the first steps (as CTranslate2's `target_prefix` and
            transformers' `forced_bos_token_id`); they are part of the
            output and count in |Y|, and their log-probability is 0.
        sampling: None (the search), or `"top_k"` / `"top_p"`: each step
            draws the next token from the model's distribution, divided by
            `temperature`, among its `top_k` most probable tokens or the
            fewest whose probabilities sum to `top_p` (`sampling.py`).
            Needs `beam_size=1`.
        top_k, top_p, temperature: the sampling's settings.
        seed: an integer; a source's sample is a function of the source
            and the seed (each seed compiles the search once on JAX and
            TensorFlow).

    Example:

    >>> settings = DecodingSettings(beam_size=4, alpha=0.6)
    >>> settings.replace(beam_size=1).beam_size
    1
    >>> DecodingSettings(num_results=5)
    Traceback (most recent call last):
    ...
    ValueError: num_results=5 needs beam_size >= 5 (beam_size=4).
    """

    beam_size: int = 4
    alpha: float = 0.6
    length_penalty: str = "gnmt"
    max_length_offset: int = 50
    num_results: int = 1
    target_prefix: tuple = ()
    sampling: str = None
    top_k: int = 50
    top_p: float = 0.9
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self):
        _check_int("beam_size", self.beam_size, minimum=1)
        _check_int("num_results", self.num_results, minimum=1)
        _check_int("max_length_offset", self.max_length_offset, minimum=None)
        check_alpha(self.alpha)
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(f"Unknown length_penalty {self.length_penalty!r}; expected one of {LENGTH_PENALTIES}.")
        if self.num_results > self.beam_size:
            raise ValueError(
                f"num_results={self.num_results} needs beam_size >= {self.num_results} (beam_size={self.beam_size})."
            )
        prefix = self.target_prefix
        if isinstance(prefix, (str, bytes)) or not isinstance(prefix, (list, tuple, np.ndarray)):
            raise TypeError(
                f"target_prefix must be a list of token ids, got {type(prefix).__name__}; "
                "TransformerSeq2SeqLM.generate also takes it as text."
            )
        for token in prefix:
            _check_int("each token id of target_prefix", token, minimum=0)
        self._check_sampling()
        # Held as Python ints in a tuple: hashable, and a compile key.
        object.__setattr__(self, "target_prefix", tuple(int(token) for token in prefix))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "beam_size", int(self.beam_size))
        object.__setattr__(self, "num_results", int(self.num_results))
        object.__setattr__(self, "max_length_offset", int(self.max_length_offset))

    def _check_sampling(self):
        if self.sampling is not None and self.sampling not in SAMPLINGS:
            raise ValueError(f"Unknown sampling {self.sampling!r}; expected None or one of {SAMPLINGS}.")
        if self.sampling is not None and self.beam_size != 1:
            raise ValueError(f"sampling={self.sampling!r} draws one output a source: it needs beam_size=1, "
                             f"got beam_size={self.beam_size}.")
        _check_int("top_k", self.top_k, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        for name, value, top in (("top_p", self.top_p, 1.0), ("temperature", self.temperature, None)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not (
                np.isfinite(value) and value > 0 and (top is None or value <= top)
            ):
                bound = "in (0, 1]" if top else "a finite number > 0"
                raise ValueError(f"{name} must be {bound}, got {value!r}.")
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.seed >= 2**31:
            raise ValueError(f"seed must be below 2**31, got {self.seed}.")
        object.__setattr__(self, "seed", int(self.seed))

    def replace(self, **changes):
        """A copy with `changes`, checked again."""
        return dataclasses.replace(self, **changes)

    def check_for(self, vocabulary_size, never_output=()):
        """Refuses a target prefix that the model cannot output: ids past
        its vocabulary, or tokens decoding never outputs (padding, start)."""
        for token in self.target_prefix:
            if token >= vocabulary_size:
                raise ValueError(
                    f"target_prefix holds token id {token}, outside the vocabulary of {vocabulary_size} tokens."
                )
            if token in set(never_output):
                raise ValueError(
                    f"target_prefix holds token id {token}, a token that decoding never outputs (padding or start)."
                )


def check_alpha(alpha):
    """Refuses a length penalty exponent that is not a finite number >= 0.

    >>> check_alpha(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: alpha (the length penalty exponent) must be a finite number >= 0, got nan.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha (the length penalty exponent) must be a finite number >= 0, got {alpha!r}.")


def _check_int(name, value, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
