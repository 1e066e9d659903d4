"""Batches of about N tokens grouped by length (section 5.1)."""

import numpy as np
import pytest

from keras_transformer.data import TokenBudgetBatches
from keras_transformer.data import token_budget_batches
from keras_transformer.data import tokenize_pairs


@pytest.fixture
def full_train_batches(multi30k_train, small_tokenizer):
    sources, targets = multi30k_train
    return token_budget_batches(sources, targets, small_tokenizer, max_tokens=4096, seed=0)


def test_every_batch_within_budget_and_padding_under_10_percent(full_train_batches):
    batches = full_train_batches
    tokens = batches.tokens_per_batch()
    assert tokens.max() <= 4096
    # Batches are filled: most hold more than 80% of the budget.
    assert np.median(tokens.max(axis=1)) > 0.8 * 4096
    fraction = batches.padding_fraction()
    print(f"{len(batches)} batches, padding fraction {fraction:.3f}")
    assert fraction < 0.10


def test_padding_fraction_counts_padding(full_train_batches):
    # Recount from the arrays the batches actually contain.
    real = total = 0
    for inputs, labels, weights in full_train_batches:
        for name in ("encoder_padding_mask", "decoder_padding_mask"):
            real += inputs[name].sum()
            total += inputs[name].size
    assert abs((1 - real / total) - full_train_batches.padding_fraction()) < 1e-9


def test_each_pair_once_with_shifted_labels(small_tokenizer):
    sources = ["Ein Hund.", "Zwei Katzen spielen.", "Eine Frau liest ein Buch im Park."] * 5
    targets = ["A dog.", "Two cats play.", "A woman reads a book in the park."] * 5
    batches = token_budget_batches(sources, targets, small_tokenizer, max_tokens=40, shuffle=False)
    seen = 0
    for inputs, labels, weights in batches:
        seen += len(labels)
        start, end = small_tokenizer.start_token_id, small_tokenizer.end_token_id
        assert (inputs["decoder_token_ids"][:, 0] == start).all()
        assert (inputs["encoder_token_ids"][:, 0] == start).all()
        # Labels are the decoder inputs shifted left by one.
        np.testing.assert_array_equal(labels[:, :-1][weights[:, 1:] > 0], inputs["decoder_token_ids"][:, 1:][weights[:, 1:] > 0])
        lengths = weights.sum(axis=1).astype(int)
        assert all(labels[row, length - 1] == end for row, length in enumerate(lengths))
        np.testing.assert_array_equal(weights > 0, labels != 0)
        assert inputs["encoder_token_ids"].shape[0] * inputs["encoder_token_ids"].shape[1] <= 40
    assert seen == len(sources)


def test_dataset_reshuffles_each_pass(small_tokenizer, multi30k_train):
    sources, targets = multi30k_train
    batches = token_budget_batches(sources[:2000], targets[:2000], small_tokenizer, max_tokens=512, seed=1)
    dataset = batches.dataset()
    first = [x["encoder_token_ids"].shape for x, _, _ in dataset.as_numpy_iterator()]
    second = [x["encoder_token_ids"].shape for x, _, _ in dataset.as_numpy_iterator()]
    assert sorted(first) == sorted(second) and first != second
    assert len(first) == len(batches)
    assert int(dataset.cardinality()) == len(batches)


def test_a_stream_started_later_goes_on_as_an_uninterrupted_one(small_tokenizer, multi30k_train):
    sources, targets = multi30k_train
    batches = token_budget_batches(sources[:2000], targets[:2000], small_tokenizer, max_tokens=512, seed=1)
    n = len(batches)

    def firsts(dataset, count):
        return [tuple(x["encoder_token_ids"][0]) for x, _, _ in dataset.take(count).as_numpy_iterator()]

    uninterrupted = firsts(batches.dataset(repeat=True), 3 * n)
    # The passes differ, and a stream resumed mid-pass sees what an
    # uninterrupted one would: not the first pass again.
    assert uninterrupted[:n] != uninterrupted[n : 2 * n]
    for start in (n, n + 5, 2 * n - 1):
        assert firsts(batches.dataset(repeat=True, start=start), 3 * n - start) == uninterrupted[start:]
    # A pass's order does not depend on the passes drawn before.
    again = token_budget_batches(sources[:2000], targets[:2000], small_tokenizer, max_tokens=512, seed=1)
    np.testing.assert_array_equal(again.order(2), batches.order(2))
    with pytest.raises(ValueError, match="needs repeat=True"):
        batches.dataset(start=3)
    with pytest.raises(ValueError, match="0 or more"):
        batches.dataset(repeat=True, start=-1)


def test_pad_to_multiple_of_bounds_the_shapes(small_tokenizer, multi30k_train):
    sources, targets = multi30k_train
    batches = token_budget_batches(sources[:3000], targets[:3000], small_tokenizer, max_tokens=1024, pad_to_multiple_of=8)
    for inputs, labels, _ in batches:
        assert inputs["encoder_token_ids"].shape[1] % 8 == 0
        assert labels.shape[1] % 8 == 0
    assert batches.tokens_per_batch().max() <= 1024


def test_padding_stops_at_max_length():
    # 11 source and 10 decoder tokens round up to 16, past a model of 12
    # positions: the batch stops at 12.
    source, target = [2, *[5] * 9, 3], [2, *[6] * 9, 3]
    batches = TokenBudgetBatches([source, [2, 5, 3]], [target, [2, 6, 3]], pad_to_multiple_of=8, max_length=12)
    (inputs, labels, weights), = list(batches)
    assert inputs["encoder_token_ids"].shape == (2, 12) and labels.shape == (2, 12)
    short, long = np.argsort(inputs["encoder_padding_mask"].sum(axis=1))
    assert inputs["encoder_token_ids"][long].tolist() == source + [0]
    assert labels[long].tolist() == target[1:] + [0, 0] and weights[long].sum() == 10
    assert inputs["encoder_token_ids"][short].tolist() == [2, 5, 3] + [0] * 9
    with pytest.raises(ValueError, match="13 tokens is longer than max_length=12"):
        TokenBudgetBatches([[2, *[5] * 11, 3]], [[2, 3]], max_length=12)


def test_long_pairs_dropped_and_budget_checked(small_tokenizer):
    encoder_ids, decoder_ids, dropped = tokenize_pairs(
        ["kurz", "ein sehr sehr sehr langer Satz mit vielen Wörtern"], ["short", "long"], small_tokenizer, max_length=6
    )
    assert dropped == 1 and len(encoder_ids) == 1
    with pytest.raises(ValueError, match="cannot hold the longest pair"):
        TokenBudgetBatches([[2, 5, 5, 5, 3]], [[2, 6, 3]], max_tokens=4)
    with pytest.raises(ValueError, match="No sentence pairs"):
        TokenBudgetBatches([], [])


def test_batches_split_evenly_across_replicas_and_shard_across_processes(small_tokenizer, multi30k_train):
    sources, targets = multi30k_train
    encoder_ids, decoder_ids, _ = tokenize_pairs(sources[:4000], targets[:4000], small_tokenizer)
    replicas, budget = 4, 512
    batches = TokenBudgetBatches(encoder_ids, decoder_ids, max_tokens=budget, num_replicas=replicas, seed=0)
    sizes = [len(batch) for batch in batches.batches]
    assert all(size % replicas == 0 for size in sizes)
    # Each replica's slice (the batch axis split evenly) keeps the per-replica budget.
    assert batches.tokens_per_batch().max() <= replicas * budget
    assert batches.tokens_per_batch().max() > 0.8 * replicas * budget
    assert 4000 - sum(sizes) < replicas  # at most the last few pairs are left out

    # Two processes: disjoint shares of the same size, together all but at
    # most one batch; also with no seed given (as `**strategy.batching()`
    # leaves it), since each process draws the same orders.
    for seed in (3, None):
        shards = [
            TokenBudgetBatches(encoder_ids, decoder_ids, max_tokens=budget, seed=seed, num_shards=2, shard_index=i)
            for i in range(2)
        ]
        assert len(shards[0]) == len(shards[1]) == len(shards[0].batches) // 2
        for _ in range(2):  # a new share on every pass
            seen = [
                [tuple(x["encoder_token_ids"][0]) + (x["encoder_token_ids"].shape,) for x, _, _ in shard]
                for shard in shards
            ]
            assert len(seen[0]) == len(seen[1]) == len(shards[0])
            assert not set(seen[0]) & set(seen[1])
    with pytest.raises(ValueError, match="shard_index"):
        TokenBudgetBatches(encoder_ids, decoder_ids, num_shards=2, shard_index=2)
    # Too little data for every process or device to get a batch.
    with pytest.raises(ValueError, match="3 pairs make 1 batches .* too few for 2 processes"):
        TokenBudgetBatches(encoder_ids[:3], decoder_ids[:3], num_shards=2)
    with pytest.raises(ValueError, match="3 pairs make 0 batches of at least 4 pairs"):
        TokenBudgetBatches(encoder_ids[:3], decoder_ids[:3], num_replicas=4)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be at least 1"):
        TokenBudgetBatches(encoder_ids, decoder_ids, pad_to_multiple_of=0)
