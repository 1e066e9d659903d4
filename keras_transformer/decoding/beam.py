"""Beam search with a length penalty (paper section 6.1).

"We used beam search with a beam size of 4 and length penalty alpha = 0.6.
We set the maximum output length during inference to input length + 50, but
terminate early when possible."

The length penalty is GNMT's (Wu et al., 2016):

    lp(Y) = ((5 + |Y|) / 6) ** alpha,    score(Y) = log P(Y | X) / lp(Y)

where |Y| counts the output tokens, the end token included. keras-hub's
`BeamSampler` has no length penalty and keeps extending beams that already
ended, adding to their scores; here a hypothesis that emits the end token is
set aside, finished, and never extended again.

At each step the `2 * beam_size` best extensions of the live beams are
ranked (as fairseq does). End tokens among the best `beam_size` of them
finish hypotheses; the best `beam_size` others stay live. A source is done
when it has `beam_size` finished hypotheses, when no live beam can still
beat the best finished one (the n-th best when n results are asked for:
log-probabilities only fall, and with alpha >= 0 the penalty only grows, so
a live beam's best possible score is its log-probability over the penalty
at the maximum length), or at the maximum length, where the live beams
finish as they are. With `beam_size=1` this is
greedy decoding.
"""

import numpy as np
from keras import ops


def length_penalty(length, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + np.asarray(length, "float64")) / 6.0) ** alpha


def _special_ids(model):
    tokenizer = getattr(model.preprocessor, "tokenizer", None)
    if tokenizer is None:
        return 0, 2, 3
    return tokenizer.pad_token_id, tokenizer.start_token_id, tokenizer.end_token_id


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def beam_search(model, sources, beam_size=4, alpha=0.6, max_length_offset=50, num_results=1):
    """Translates token id sequences with beam search.

    Args:
        model: a `TransformerSeq2SeqLM`.
        sources: a list of source token id lists (start and end tokens
            included); an empty list gives an empty result.
        beam_size: live hypotheses per source (the paper: 4).
        alpha: length penalty exponent (the paper: 0.6; 0 ranks by raw
            log-probability).
        max_length_offset: at most source length + this many output tokens
            (the paper: 50), and never more than the model's
            `max_sequence_length` allows.
        num_results: how many best hypotheses to return per source (at most
            `beam_size`).

    Returns:
        For each source, a list of `num_results` `(token_ids, score,
        log_probability)` tuples, best first; token ids exclude the start
        and end tokens. Empty sources give `[]`.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}.")
    if not 1 <= num_results <= beam_size:
        raise ValueError(f"num_results must be between 1 and beam_size={beam_size}, got {num_results}.")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}.")
    pad_id, start_id, end_id = _special_ids(model)
    results = [[] for _ in sources]
    rows = [i for i, ids in enumerate(sources) if ids]
    if not rows:
        return results
    batch, k = len(rows), beam_size
    source_length = _round_up(max(len(sources[i]) for i in rows), 8)
    encoder_ids = np.full((batch, source_length), pad_id, "int32")
    for row, i in enumerate(rows):
        encoder_ids[row, : len(sources[i])] = sources[i]
    encoder_mask = (encoder_ids != pad_id).astype("int32")
    limit = model.backbone.max_sequence_length
    # Output tokens allowed for each source (the start token takes a position).
    budgets = np.array([min(len(sources[i]) + max_length_offset, limit - 1) for i in rows])
    max_length = min(_round_up(int(budgets.max()) + 1, 8), limit)

    encode, step = model.decoding_functions()
    _, cross_caches = encode(encoder_ids, encoder_mask)
    # Every beam of a source reads the same encoder keys and values.
    beam_mask = np.repeat(encoder_mask, k, axis=0)
    cache = [
        (self_cache, (ops.repeat(keys, k, axis=0), ops.repeat(values, k, axis=0)))
        for self_cache, (keys, values) in zip(model.empty_self_attention_cache(batch * k, max_length), cross_caches)
    ]
    parents_flat = np.arange(batch * k, dtype="int32")

    tokens = np.full((batch * k,), start_id, "int32")
    sequences = np.zeros((batch, k, 0), "int32")
    # Only the first beam is live at the start: the others would repeat it.
    log_probs = np.full((batch, k), -np.inf)
    log_probs[:, 0] = 0.0
    finished = [[] for _ in range(batch)]  # (score, log_prob, token_ids)
    done = np.zeros(batch, bool)

    for index in range(max_length - 1):
        logits, cache = step(tokens[:, None], np.asarray(index, "int32"), cache, beam_mask, parents_flat)
        token_log_probs = ops.convert_to_numpy(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
        token_log_probs = token_log_probs.astype("float64").reshape(batch, k, -1)
        vocabulary_size = token_log_probs.shape[-1]
        # Padding and start tokens are never outputs.
        token_log_probs[:, :, [pad_id, start_id]] = -np.inf
        candidates = (log_probs[:, :, None] + token_log_probs).reshape(batch, -1)
        order = np.argsort(-candidates, axis=1, kind="stable")[:, : 2 * k]

        new_log_probs = np.full((batch, k), -np.inf)
        parents = np.zeros((batch, k), "int64")
        new_tokens = np.full((batch, k), pad_id, "int32")
        length = index + 1
        for row in range(batch):
            if done[row]:
                continue
            live = 0
            for rank, flat in enumerate(order[row]):
                value = candidates[row, flat]
                if not np.isfinite(value):
                    break
                parent, token = divmod(int(flat), vocabulary_size)
                if token == end_id:
                    if rank < k:
                        ids = sequences[row, parent].tolist()
                        finished[row].append((value / length_penalty(length, alpha), value, ids))
                    continue
                if live < k:
                    new_log_probs[row, live], parents[row, live], new_tokens[row, live] = value, parent, token
                    live += 1
            if length >= budgets[row]:
                # The maximum length: live beams finish as they are.
                for beam in range(live):
                    ids = sequences[row, parents[row, beam]].tolist() + [int(new_tokens[row, beam])]
                    score = new_log_probs[row, beam] / length_penalty(length, alpha)
                    finished[row].append((score, new_log_probs[row, beam], ids))
                done[row] = True
            elif len(finished[row]) >= k or live == 0:
                done[row] = True
            elif len(finished[row]) >= num_results:
                # The n-th best finished score that a live beam must beat.
                bar = sorted((score for score, _, _ in finished[row]), reverse=True)[num_results - 1]
                reachable = new_log_probs[row, :live].max() / length_penalty(budgets[row], alpha)
                done[row] = bar >= reachable
        if done.all():
            break
        parents_flat = (np.arange(batch)[:, None] * k + parents).reshape(-1).astype("int32")
        sequences = np.concatenate(
            [sequences[np.arange(batch)[:, None], parents], new_tokens[:, :, None]], axis=2
        )
        log_probs = np.where(done[:, None], -np.inf, new_log_probs)
        tokens = new_tokens.reshape(-1)

    for row, i in enumerate(rows):
        ranked = sorted(finished[row], key=lambda item: -item[0])[:num_results]
        results[i] = [(ids, float(score), float(log_prob)) for score, log_prob, ids in ranked]
    return results
