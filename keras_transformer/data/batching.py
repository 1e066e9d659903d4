"""Batches of about N tokens, grouped by length (paper section 5.1).

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens."

Pairs are sorted by length, then cut into batches greedily so that each
batch, padded to its longest source and longest target, holds at most
`max_tokens` source tokens and at most `max_tokens` target tokens (padding
included). Batches are fixed once and their order is shuffled every epoch,
as fairseq does; pairs of similar length share a batch, so little padding is
spent.

tensorflow-text and keras-hub have no token-budget batcher (`tf.data`'s
`bucket_by_sequence_length` fixes the sentence count per bucket, not the
token count), hence this module.
"""

import numpy as np

_INPUTS = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids", "decoder_padding_mask")

# The largest token budget a batch may have: a million tokens, forty times
# the paper's (about 25,000), already more than a large GPU's memory holds
# for the big model; a larger one is a mistake (an extra digit).
MAX_TOKENS_LIMIT = 2**20


def _round_up(length, multiple):
    return -(-length // multiple) * multiple


class TokenBudgetBatches:
    """Length-grouped batches of tokenized pairs under a token budget.

    Args:
        encoder_ids: a list of source token id sequences (start and end
            tokens included).
        decoder_ids: a list of target token id sequences, `<s> ... </s>`.
            The decoder reads all but the last token and learns to predict
            all but the first.
        max_tokens: the budget: at most this many source tokens and at most
            this many target tokens in a batch, padding included. It is per
            replica: with `num_replicas` devices a batch holds up to
            `num_replicas * max_tokens` tokens and each device gets at most
            `max_tokens` of them.
        pad_to_multiple_of: round padded lengths up to a multiple of this.
            1 (the default) spends the least padding; larger values give
            fewer distinct batch shapes, which saves JAX and XLA compilations.
        max_length: the model's `max_sequence_length`, if given: padded
            lengths never go past it (learned positions have no more), and
            a longer sequence is an error.
        pad_id: the padding token id.
        shuffle: shuffle the batch order on every pass.
        seed: seed of the shuffling. With several `num_shards`, None
            means 0: every process must draw the same orders.
        num_replicas: devices that each batch is split across (JAX and
            TensorFlow data parallelism split the batch axis): every batch
            holds a multiple of this many pairs; the last few pairs that do
            not fill one pair per device are left out.
        num_shards: processes that train together (multi-host JAX or
            TensorFlow, PyTorch DDP): each reads its own share of the
            batches, the same number each, a new share on every pass.
        shard_index: this process's share, from 0 to `num_shards - 1`.
            `keras_transformer.distribution` gives all three
            (`**strategy.batching()`).

    Example:

    ```python
    batches = token_budget_batches(sources, targets, tokenizer, max_tokens=4096)
    print(len(batches), batches.padding_fraction())
    model.fit(batches.dataset(), epochs=10)
    ```
    """

    def __init__(
        self,
        encoder_ids,
        decoder_ids,
        max_tokens=4096,
        pad_to_multiple_of=1,
        max_length=None,
        pad_id=0,
        shuffle=True,
        seed=None,
        num_replicas=1,
        num_shards=1,
        shard_index=0,
    ):
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index must be in [0, {num_shards}), got {shard_index}.")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}.")
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}.")
        if num_shards > 1 and seed is None:
            seed = 0
        if len(encoder_ids) != len(decoder_ids):
            raise ValueError(
                f"{len(encoder_ids)} source sequences but {len(decoder_ids)} target sequences."
            )
        if not len(encoder_ids):
            raise ValueError("No sentence pairs to batch.")
        self.encoder_ids = [np.asarray(ids, "int32") for ids in encoder_ids]
        self.decoder_ids = [np.asarray(ids, "int32") for ids in decoder_ids]
        self.max_tokens = int(max_tokens)
        if not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(
                f"max_tokens={self.max_tokens} is out of range: a batch holds 1 to {MAX_TOKENS_LIMIT:,} tokens "
                "(the paper's held about 25,000). Choose a budget your device's memory holds."
            )
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.max_length = None if max_length is None else int(max_length)
        self.pad_id = pad_id
        self.shuffle = shuffle
        self.num_replicas, self.num_shards, self.shard_index = int(num_replicas), int(num_shards), int(shard_index)
        # Pass k's order is drawn from this seed alone (every process draws
        # the same and takes its share), so a resumed run can go on with the
        # order an uninterrupted one would have had.
        self._seed = np.random.SeedSequence(seed).entropy
        self._passes = 0
        source_lengths = np.array([len(ids) for ids in self.encoder_ids])
        # The decoder sees the target without its last token.
        target_lengths = np.array([len(ids) - 1 for ids in self.decoder_ids])
        if self.max_length is not None:
            too_long = int(max(source_lengths.max(), target_lengths.max() + 1))
            if too_long > self.max_length:
                raise ValueError(
                    f"A sequence of {too_long} tokens is longer than max_length={self.max_length}: "
                    "drop the longer pairs first (`tokenize_pairs(..., max_length=...)`)."
                )
        longest = max(self._pad(int(source_lengths.max())), self._pad(int(target_lengths.max())))
        if longest > self.max_tokens:
            raise ValueError(
                f"max_tokens={self.max_tokens} cannot hold the longest pair "
                f"({longest} tokens). Raise max_tokens or filter long pairs."
            )
        self.source_lengths, self.target_lengths = source_lengths, target_lengths
        self.batches = self._make_batches()
        if len(self.batches) < self.num_shards:
            raise ValueError(
                f"{len(encoder_ids)} pairs make {len(self.batches)} batches of at least {self.num_replicas} "
                f"pairs (one a device), too few for {self.num_shards} processes to get one each: "
                "use more pairs, or a smaller max_tokens."
            )

    def _pad(self, lengths):
        """Padded lengths: rounded up, but not past `max_length`."""
        padded = _round_up(lengths, self.pad_to_multiple_of)
        return padded if self.max_length is None else np.minimum(padded, self.max_length)

    def _make_batches(self):
        order = np.lexsort((self.target_lengths, self.source_lengths))
        padded_source = self._pad(self.source_lengths)
        padded_target = self._pad(self.target_lengths)
        replicas, budget = self.num_replicas, self.max_tokens * self.num_replicas
        batches, current, source_max, target_max = [], [], 0, 0
        for index in order:
            current.append(index)
            source_max = max(source_max, padded_source[index])
            target_max = max(target_max, padded_target[index])
            size = len(current)
            if size > 1 and (size * source_max > budget or size * target_max > budget):
                # Close the batch before this pair, with a multiple of
                # `replicas` pairs: the longest few move to the next batch.
                keep = (size - 1) // replicas * replicas
                batches.append(np.array(current[:keep]))
                current = current[keep:]
                source_max, target_max = padded_source[current].max(), padded_target[current].max()
        # The budget holds the longest pair (checked above), so every batch
        # closed in the loop keeps at least `replicas` pairs.
        keep = len(current) // replicas * replicas
        if keep:
            batches.append(np.array(current[:keep]))
        return batches

    def __len__(self):
        """Batches a pass gives this process (its shard)."""
        return len(self.batches) // self.num_shards

    def _padded_lengths(self, batch):
        return (
            int(self._pad(int(self.source_lengths[batch].max()))),
            int(self._pad(int(self.target_lengths[batch].max()))),
        )

    def padding_fraction(self):
        """The share of padding among all source and target positions."""
        real = padded = 0
        for batch in self.batches:
            source_length, target_length = self._padded_lengths(batch)
            real += int(self.source_lengths[batch].sum() + self.target_lengths[batch].sum())
            padded += len(batch) * (source_length + target_length)
        return 1.0 - real / padded

    def tokens_per_batch(self):
        """`(source, target)` padded token counts of every batch, an array
        of shape `(num_batches, 2)`."""
        return np.array([[len(b) * n for n in self._padded_lengths(b)] for b in self.batches])

    def batch(self, batch):
        """The padded arrays of the pairs `batch` (indices):
        `(inputs, labels, sample_weight)`."""
        source_length, target_length = self._padded_lengths(batch)
        size = len(batch)
        encoder = np.full((size, source_length), self.pad_id, "int32")
        decoder_inputs = np.full((size, target_length), self.pad_id, "int32")
        labels = np.full((size, target_length), self.pad_id, "int32")
        for row, index in enumerate(batch):
            source, target = self.encoder_ids[index], self.decoder_ids[index]
            encoder[row, : len(source)] = source
            # `<s> y1 .. yn` in, `y1 .. yn </s>` out.
            decoder_inputs[row, : len(target) - 1] = target[:-1]
            labels[row, : len(target) - 1] = target[1:]
        inputs = {
            "encoder_token_ids": encoder,
            "encoder_padding_mask": (encoder != self.pad_id).astype("int32"),
            "decoder_token_ids": decoder_inputs,
            "decoder_padding_mask": (decoder_inputs != self.pad_id).astype("int32"),
        }
        return inputs, labels, (labels != self.pad_id).astype("float32")

    def order(self, pass_index):
        """The indices into `self.batches` that pass `pass_index` (0 is the
        first) gives this process, in order. The same for the same seed
        however many passes were drawn before."""
        if self.shuffle:
            rng = np.random.default_rng(self._seed)
            for _ in range(pass_index):
                rng.permutation(len(self.batches))
            order = rng.permutation(len(self.batches))
        else:
            order = np.arange(len(self.batches))
        return order[self.shard_index :: self.num_shards][: len(self)]

    def __iter__(self):
        """One pass, the next one each time."""
        order = self.order(self._passes)
        self._passes += 1
        for i in order:
            yield self.batch(self.batches[i])

    def _stream(self, start):
        """Every pass one after the other, from the `start`-th batch on."""
        pass_index, offset = divmod(start, len(self))
        while True:
            for i in self.order(pass_index)[offset:]:
                yield self.batch(self.batches[i])
            pass_index, offset = pass_index + 1, 0

    def dataset(self, repeat=False, start=0):
        """A `tf.data.Dataset` of `(inputs, labels, sample_weight)` batches.

        Every pass over the dataset shuffles the batch order anew. Works as
        `model.fit` input on every backend.

        Args:
            repeat: one pass (`False`), or every pass after the other, without
                end, for `fit` with `steps_per_epoch`.
            start: with `repeat`, the batches to skip, as if trained on
                already: a resumed run passes the steps it has done and goes
                on with the batches an uninterrupted run would see next,
                rather than with the first pass's again.
        """
        if start and not repeat:
            raise ValueError(f"start={start} needs repeat=True: one pass has no batches to skip.")
        if start < 0:
            raise ValueError(f"start must be 0 or more; got {start}.")
        import tensorflow as tf

        ids = tf.TensorSpec((None, None), tf.int32)
        signature = (
            {name: ids for name in _INPUTS},
            ids,
            tf.TensorSpec((None, None), tf.float32),
        )
        generator = (lambda: self._stream(start)) if repeat else self.__iter__
        dataset = tf.data.Dataset.from_generator(generator, output_signature=signature)
        # The batches are already this process's: tf.distribute must not
        # shard them again (it still splits each batch across the devices).
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
        if not repeat:
            # A generator's length is unknown to tf.data; told it, Keras
            # knows an epoch's steps (a progress bar with an end, and no
            # "ran out of data" warning after a validation pass).
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self)))
        return dataset.prefetch(tf.data.AUTOTUNE)


def tokenize_pairs(sources, targets, tokenizer, max_length=None):
    """Framed token ids (`<s> ... </s>` with this package's vocabularies;
    see `SpecialTokenIds`) for each source and target string.

    Pairs where a side is longer than `max_length` tokens (start and end
    included) are dropped; the number dropped is returned too.

    Returns:
        `(encoder_ids, decoder_ids, num_dropped)`.
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets.")
    from keras_transformer.models.transformer.seq2seq_lm_preprocessor import token_id_lists
    from keras_transformer.models.transformer.special_tokens import special_token_ids

    special = special_token_ids(tokenizer)
    encoder_ids, decoder_ids, dropped = [], [], 0
    target_tokenizer = getattr(tokenizer, "tokenize_target", tokenizer)
    source_tokens, target_tokens = token_id_lists(tokenizer, sources), token_id_lists(target_tokenizer, targets)
    for source, target in zip(source_tokens, target_tokens):
        source, target = special.frame_source(source), special.frame_target(target)
        if max_length and (len(source) > max_length or len(target) > max_length):
            dropped += 1
            continue
        encoder_ids.append(source)
        decoder_ids.append(target)
    return encoder_ids, decoder_ids, dropped


def token_budget_batches(
    sources,
    targets,
    tokenizer,
    max_tokens=4096,
    max_length=None,
    pad_to_multiple_of=1,
    shuffle=True,
    seed=None,
    num_replicas=1,
    num_shards=1,
    shard_index=0,
):
    """Tokenizes string pairs and groups them into token-budget batches.

    Args:
        sources: source sentences.
        targets: target sentences, as many.
        tokenizer: a `TransformerTokenizer`.
        max_tokens: at most this many source and this many target tokens in
            a batch (per replica), padding included.
        max_length: drop pairs with a side longer than this (start and end
            tokens included), for example the model's `max_sequence_length`;
            padded lengths do not go past it either.
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        shuffle: shuffle the batch order on every pass.
        seed: seed of the shuffling. With several `num_shards`, None
            means 0: every process must draw the same orders.
        num_replicas, num_shards, shard_index: for training on several
            devices or processes, see `TokenBudgetBatches`.

    Returns:
        A `TokenBudgetBatches`; `.dataset()` gives the `tf.data.Dataset`.
    """
    encoder_ids, decoder_ids, _ = tokenize_pairs(sources, targets, tokenizer, max_length)
    return TokenBudgetBatches(
        encoder_ids,
        decoder_ids,
        max_tokens=max_tokens,
        pad_to_multiple_of=pad_to_multiple_of,
        max_length=max_length,
        pad_id=tokenizer.pad_token_id,
        shuffle=shuffle,
        seed=seed,
        num_replicas=num_replicas,
        num_shards=num_shards,
        shard_index=shard_index,
    )
