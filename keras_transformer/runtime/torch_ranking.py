"""PyTorch's ranking of a decoding step's extensions (`best_extensions`,
which `decoding.rules.best_extensions` hands over to on PyTorch), in
PyTorch's own calls: PyTorch runs a decoding step eagerly, and for one
sentence's beams the dozen Keras ops of the other version (each converting
and checking its inputs) took as long as the decoder layers' arithmetic.
The values, and the order of ties where `topk` keeps lower indices first,
are those of `decoding.rules.best_extensions`."""

import functools
import math

import numpy as np
import torch


def best_extensions(logits, log_probs, never_output, count):
    """`decoding.rules.best_extensions` on PyTorch.

    Where the vocabulary divides into chunks (`_source_chunk_length`), a
    source's extensions are ranked in chunks of its beams' tokens
    (`_best_in_chunks`), not each beam's tokens first: PyTorch's CPU
    `topk` costs about a microsecond a row for rows of a few hundred
    values, and ranking each of 256 beams' best chunks and then their
    tokens took more than the log-softmax itself. Otherwise each beam's
    best tokens are ranked first, as on the other backends.
    """
    logits = torch.as_tensor(logits)
    log_probs = torch.as_tensor(log_probs, dtype=torch.float32, device=logits.device)
    batch, beams = log_probs.shape
    vocabulary_size = len(never_output)
    bias, forbidden = _torch_never_output(never_output, logits.device)
    if logits.dtype == torch.float32 or torch.is_grad_enabled():
        token_log_probs = torch.log_softmax(logits.float(), dim=-1)
    else:
        # Lower-precision logits: their float32 copy, this function's own,
        # takes the log-softmax in place (row by row, each row read before
        # it is written). Another new buffer of the logits' size costs more
        # than the log-softmax at 64 sentences' beams: bfloat16, (256,
        # 8,000) logits, 2-core AMD EPYC, the conversion and log-softmax
        # 2.3-4.2 ms a step into a new buffer, 2.4 in place.
        token_log_probs = logits.float()
        torch.ops.aten._log_softmax.out(token_log_probs, -1, False, out=token_log_probs)
    chunk = _source_chunk_length(beams, vocabulary_size, count)
    if chunk is not None:
        token_log_probs.index_fill_(1, forbidden, -math.inf)  # (a new tensor: this step's own)
        return _best_in_chunks(token_log_probs.view(batch, beams, vocabulary_size), log_probs, count, chunk)
    per_beam = min(count + len(forbidden), vocabulary_size)
    count = min(count, beams * per_beam)
    best, tokens = torch.topk(token_log_probs, per_beam)
    candidates = (best + bias[tokens]).view(batch, beams, per_beam) + log_probs[:, :, None]
    values, order = torch.topk(candidates.view(batch, beams * per_beam), count)
    tokens = tokens.view(batch, beams * per_beam).gather(1, order)
    return values, (order // per_beam) * vocabulary_size + tokens


def _best_in_chunks(token_log_probs, log_probs, count, chunk):
    """The `count` best extensions of each source's beams, from their
    `(batch, beams, vocabulary_size)` token log-probabilities (never-output
    tokens at `-inf`) and `(batch, beams)` log-probabilities, ranked in
    chunks of `chunk` consecutive tokens of a beam: a source's `count` best
    extensions lie in the `count` chunks whose best extension (the chunk's
    best token plus its beam's log-probability) is best, since each of
    those chunks holds an extension at least as good as the `count`-th
    best, so only those chunks' tokens are ranked. Each value is a token's
    log-probability plus its beam's, as ranking every extension gives it;
    PyTorch's `topk` leaves the order of equal values open.
    """
    batch, beams, vocabulary_size = token_log_probs.shape
    per_beam = vocabulary_size // chunk
    chunks = token_log_probs.view(batch, beams * per_beam, chunk)
    maxima = chunks.amax(-1).view(batch, beams, per_beam) + log_probs[:, :, None]
    _, best_chunks = torch.topk(maxima.view(batch, beams * per_beam), count)
    beam_of_chunk = best_chunks // per_beam
    candidates = chunks.gather(1, best_chunks[:, :, None].expand(-1, -1, chunk))
    candidates = candidates + log_probs.gather(1, beam_of_chunk)[:, :, None]
    values, within = torch.topk(candidates.view(batch, count * chunk), count)
    picked = best_chunks.gather(1, within // chunk)  # beam * per_beam + chunk of the beam
    # (`chunk` divides the vocabulary: chunk `picked` starts at flat index
    # `beam * vocabulary_size + (picked % per_beam) * chunk`, `picked * chunk`.)
    return values, picked * chunk + within % chunk


@functools.lru_cache(maxsize=64)  # (called at every step with the same few arguments)
def _source_chunk_length(beams, vocabulary_size, count):
    """The chunk length of `_best_in_chunks`: the divisor of
    `vocabulary_size` from 32 to 320 tokens nearest 160, with at least
    `4 * count` chunks a source; None where there is none. Measured on
    8,000 tokens (2-core Intel Xeon, 64 sources of 4 beams, the whole
    ranking with the log-softmax): 1.37 ms in chunks of 160 tokens, 1.55
    of 32, 1.68 of 64, 1.60 of 400; each beam's tokens ranked first, 2.04.
    """
    divisors = [
        n for n in range(32, 321) if vocabulary_size % n == 0 and beams * (vocabulary_size // n) >= 4 * count
    ]
    return min(divisors, key=lambda n: abs(n - 160), default=None)


# The last never-output bias `_torch_never_output` converted: a search
# passes the same array at every step.
_never_output_held = [None, None]


def _torch_never_output(never_output, device):
    """`never_output` as a PyTorch tensor on `device`, and the indices of
    the tokens it forbids (a tensor); converted once for the same array."""
    array, held = _never_output_held
    if array is not never_output or held[0].device != device:
        forbidden = np.flatnonzero(np.isneginf(never_output))
        held = (torch.as_tensor(never_output, device=device), torch.as_tensor(forbidden, device=device))
        _never_output_held[:] = [never_output, held]
    return held
