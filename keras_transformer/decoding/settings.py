"""Decoding settings, held and checked in one place (paper section 6.1).

`DecodingSettings` is to this package what transformers' `GenerationConfig`
is to theirs: every setting of a search (beam size, length penalty, output
budget, n-best, a forced target prefix), checked once when it is made,
then read by every path that searches (`beam.beam_search`, the compiled
loops, ensembles, the SavedModel). It is frozen and hashable, so compiled
searches are kept by their settings.
"""

import dataclasses
import os

import numpy as np

# "gnmt": the paper's (GNMT's) ((5 + |Y|) / 6) ** alpha; "length": |Y| **
# alpha, as Hugging Face transformers (and Marian) rank hypotheses.
LENGTH_PENALTIES = ("gnmt", "length")
# Sampling instead of the search's ranking (`sampling.py`).
SAMPLINGS = ("top_k", "top_p")
# Upper bounds of the sizes a user gives, checked before anything is
# allocated: far above any search that is useful (research on the beam
# search curse goes to beams of a few hundred), and below those that would
# exhaust a machine or overflow an int64 length.
MAX_BEAM_SIZE = 1024
MAX_LENGTH_OFFSET = 1 << 20
MAX_BATCH_SIZE = 1 << 20
# n of `no_repeat_ngram_size`: beyond any output's length (outputs have at
# most max_sequence_length tokens), where the guard would ban nothing.
MAX_NGRAM_SIZE = 1 << 16
# The share of the machine's memory one request may plan to use.
MEMORY_SHARE = 0.8


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
        no_repeat_ngram_size: n > 0: no output holds the same n tokens
            twice (as fairseq's and transformers' `no_repeat_ngram_size`):
            a token that would complete an n-gram the hypothesis already
            holds is never chosen (`transforms.no_repeat_ngram`). 0: off.

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
    no_repeat_ngram_size: int = 0

    def __post_init__(self):
        check_int("beam_size", self.beam_size, minimum=1, maximum=MAX_BEAM_SIZE)
        check_int("num_results", self.num_results, minimum=1, maximum=MAX_BEAM_SIZE)
        check_int("max_length_offset", self.max_length_offset, minimum=-MAX_LENGTH_OFFSET, maximum=MAX_LENGTH_OFFSET)
        check_alpha(self.alpha)
        check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, minimum=0, maximum=MAX_NGRAM_SIZE)
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
            check_int("each token id of target_prefix", token, minimum=0)
        self._check_sampling()
        # Held as Python ints in a tuple: hashable, and a compile key.
        object.__setattr__(self, "target_prefix", tuple(int(token) for token in prefix))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "beam_size", int(self.beam_size))
        object.__setattr__(self, "num_results", int(self.num_results))
        object.__setattr__(self, "max_length_offset", int(self.max_length_offset))
        object.__setattr__(self, "no_repeat_ngram_size", int(self.no_repeat_ngram_size))

    def _check_sampling(self):
        if self.sampling is not None and self.sampling not in SAMPLINGS:
            raise ValueError(f"Unknown sampling {self.sampling!r}; expected None or one of {SAMPLINGS}.")
        if self.sampling is not None and self.beam_size != 1:
            raise ValueError(f"sampling={self.sampling!r} draws one output a source: it needs beam_size=1, "
                             f"got beam_size={self.beam_size}.")
        check_int("top_k", self.top_k, minimum=1, maximum=2**31 - 1)
        check_int("seed", self.seed, minimum=0)
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


    def check_memory(self, batch_size, backbone, longest_source, models=1, available=None):
        """Refuses a search whose caches and beams would need more memory
        than the machine has (`available` bytes, by default
        `available_memory()`), before anything is allocated, naming the
        sizes to lower.

        Args:
            batch_size: sources searched together.
            backbone: has `num_layers`, `d_model`, `vocabulary_size` and
                `max_sequence_length`.
            longest_source: the longest source's token count.
            models: how many models search together (an ensemble's).
        """
        check_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
        needed = models * search_bytes(self, batch_size, backbone, longest_source)
        available = available_memory() if available is None else available
        if available and needed > MEMORY_SHARE * available:
            raise MemoryError(
                f"This search needs about {_gib(needed)} of memory (beam_size={self.beam_size}, batch_size="
                f"{batch_size}, outputs of up to {_output_length(self, backbone, longest_source)} tokens), more than "
                f"{MEMORY_SHARE:.0%} of the {_gib(available)} this machine has. Lower beam_size or batch_size "
                "(or max_length_offset)."
            )


def search_bytes(settings, batch_size, backbone, longest_source):
    """About how many bytes a search of `batch_size` sources holds at once:
    the decoder's key/value caches (self- and cross-attention) of every
    beam, and the scores of twice as many candidates over the vocabulary,
    in float32."""
    rows = batch_size * settings.beam_size
    length = _output_length(settings, backbone, longest_source)
    caches = 2 * backbone.num_layers * rows * (length + longest_source) * backbone.d_model
    candidates = 3 * rows * backbone.vocabulary_size
    return 4 * (caches + candidates)


def _output_length(settings, backbone, longest_source):
    return int(max(1, min(longest_source + settings.max_length_offset, backbone.max_sequence_length)))


def available_memory():
    """The bytes of memory this process may use: the machine's physical
    memory, or the container's (cgroup) limit if lower; None where
    neither can be read."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and (total is None or int(limit) < total):
            total = int(limit)
    return total


def _gib(size):
    return f"{size / 2**30:.1f} GiB"


def check_alpha(alpha):
    """Refuses a length penalty exponent that is not a finite number >= 0.

    >>> check_alpha(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: alpha (the length penalty exponent) must be a finite number >= 0, got nan.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha (the length penalty exponent) must be a finite number >= 0, got {alpha!r}.")


def check_int(name, value, minimum=1, maximum=None):
    """Refuses a size that is not an integer in [`minimum`, `maximum`]
    (None: no bound).

    >>> check_int("beam_size", 10**9, maximum=MAX_BEAM_SIZE)
    Traceback (most recent call last):
    ...
    ValueError: beam_size must be at most 1024, got 1000000000.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}.")
