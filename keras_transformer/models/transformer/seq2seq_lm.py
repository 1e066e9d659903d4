"""The translation task: the backbone, the pre-softmax projection, the paper's
training recipe (section 5) and decoding (section 6.1)."""

import warnings

import keras
import keras_hub
from keras import ops

from keras_transformer.decoding.interface import forget_decoding_functions
from keras_transformer.decoding.samplers import keras_hub_generate_step
from keras_transformer.runtime.backend_choices import builds_optimizer_before_tracing
from keras_transformer.runtime.backend_choices import direct_calls_where_eager
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import TokenAccuracy
from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer import generation
from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.models.transformer.ensemble_members import EnsembleMembers
from keras_transformer.models.transformer.in_memory_data import check_in_memory
from keras_transformer.models.transformer.in_memory_data import fit_data
from keras_transformer.models.transformer.in_memory_data import with_languages
from keras_transformer.models.transformer.languages import model_languages
from keras_transformer.models.transformer.seq2seq_lm_preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.models.transformer.special_tokens import special_token_ids
from keras_transformer.schedules import paper_optimizer
from keras_transformer.utils.arguments import check_model_keywords
from keras_transformer.utils.memory import one_garbage_collection


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLM(EnsembleMembers, PresetIO, keras_hub.models.Seq2SeqLM):
    """A Transformer that translates: `fit` on sentence pairs, `generate`.

    The functional model maps the backbone's inputs to logits over the
    shared vocabulary, through the embedding matrix transposed (section
    3.4). `compile()` defaults to the paper's recipe: Adam(0.9, 0.98, 1e-9)
    on the warm-up schedule of equation (3) (section 5.3) and cross-entropy
    with label smoothing 0.1 that ignores padding (section 5.4).

    `fit` takes `{"encoder_text": sources, "decoder_text": targets}` (the
    preprocessor tokenizes them), or a `tf.data.Dataset` of already tokenized
    batches such as `keras_transformer.data.token_budget_batches(...).dataset()`.

    Args:
        backbone: a `TransformerBackbone`.
        preprocessor: a `TransformerSeq2SeqLMPreprocessor`, or None to feed
            token ids yourself.
        **kwargs: `keras_hub.models.Seq2SeqLM` arguments.

    Example:

    ```python
    tokenizer = TransformerTokenizer.from_texts(sources + targets, 8000)
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer)
    backbone = TransformerBackbone(tokenizer.vocabulary_size(), num_layers=3,
                                   d_model=256, d_ff=1024, num_heads=4)
    model = TransformerSeq2SeqLM(backbone, preprocessor)
    model.fit({"encoder_text": sources, "decoder_text": targets}, epochs=10)
    model.generate(["A man rides a bicycle."])  # beam 4, alpha 0.6
    ```
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor
    _compile_defaults_after_loading = True

    def __init__(self, backbone, preprocessor=None, **kwargs):
        check_model_keywords(type(self), kwargs)
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor

        # === Functional model ===
        inputs = backbone.input
        hidden_states = backbone(inputs)["decoder_sequence_output"]
        logits = backbone.token_embedding(hidden_states, reverse=True)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        sampler="greedy",
        warmup_steps=4000,
        label_smoothing=0.1,
        **kwargs,
    ):
        """Configures training; the defaults are the paper's recipe.

        Args:
            optimizer: `"auto"` for `paper_optimizer(d_model, warmup_steps)`,
                or any Keras optimizer.
            loss: `"auto"` for `LabelSmoothedCrossEntropy(label_smoothing)`
                ignoring the padding id, or any Keras loss.
            weighted_metrics: `"auto"` for token accuracy over real tokens.
            sampler: kept for keras-hub compatibility; `generate` takes its
                own `sampler` argument.
            warmup_steps: warm-up of the `"auto"` schedule.
            label_smoothing: eps_ls of the `"auto"` loss.
            **kwargs: further `keras.Model.compile` arguments.
        """
        if optimizer == "auto":
            optimizer = paper_optimizer(self.backbone.d_model, warmup_steps=warmup_steps)
        if loss == "auto":
            loss = LabelSmoothedCrossEntropy(label_smoothing, ignore_class=self._pad_id)
        if weighted_metrics == "auto":
            weighted_metrics = [TokenAccuracy()]
        super().compile(
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            sampler=sampler,
            **kwargs,
        )

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        sample_weight=None,
        validation_data=None,
        validation_split=None,
        shuffle=True,
        long_pairs="error",
        source_language=None,
        target_language=None,
        **kwargs,
    ):
        """`keras.Model.fit`, shuffling data held in memory every epoch.

        keras-hub batches strings and arrays in the order given, the same
        every epoch, and ignores `shuffle` (Keras warns that it does). Here
        such data (a dict, list, tuple or array) is shuffled anew each epoch,
        as `keras.Model.fit` does, unless `shuffle=False`. `validation_split`
        works on sentence pairs too (keras-hub takes only arrays): the last
        pairs, before shuffling, are the validation data, as in Keras.
        Datasets are read as they are: they shuffle themselves, like
        `token_budget_batches(...).dataset()`.

        Sentence pairs held in memory are checked first, as `generate`
        checks its sources: strings (or UTF-8 bytes), at least one pair,
        none longer than the preprocessor's sequence lengths. Long pairs
        are an error that counts them unless `long_pairs` is `"drop"`
        (leave them out) or `"truncate"` (cut them, as keras-hub does);
        `evaluate` and `predict` take `long_pairs` too.

        A multilingual model (M2M100, NLLB-200) learns a pair with
        `source_language` and `target_language` (as `generate` takes them):
        their codes start the sources and targets held in memory, framed
        as the checkpoint was trained (`languages.with_pair_languages`);
        `evaluate` takes them too.
        """
        data = fit_data(self.preprocessor, x, y, batch_size, sample_weight, validation_data, validation_split, shuffle,
                        long_pairs, source_language, target_language)
        return super().fit(**data, shuffle=False, **kwargs)

    def evaluate(self, x=None, y=None, *args, long_pairs="error", source_language=None, target_language=None, **kwargs):
        x, _ = with_languages(self.preprocessor, x, None, source_language, target_language)
        x, _ = check_in_memory(self.preprocessor, x, y, "evaluate", long_pairs=long_pairs)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x=None, *args, long_pairs="error", **kwargs):
        x, _ = check_in_memory(self.preprocessor, x, None, "predict", long_pairs=long_pairs)
        return super().predict(x, *args, **kwargs)

    def make_train_function(self, force=False):
        """Keras' training function (for `fit` and `train_on_batch`), with
        the optimizer's variables (Adam's moments) created first.

        Keras on TensorFlow, without a distribution strategy, leaves them
        to the first trace of the step, and a `tf.function` that creates
        variables is traced twice: building them here first halves the time
        to the first step of the tiny config (14.9 -> 7.6 s on a 2-core
        CPU; 25.5 -> 13.8 s with XLA) and takes 0.72x the time for the
        small one (`benchmarks/first_step.py`). Under a strategy Keras
        builds them itself, in the strategy's scope; the other backends
        build them before compiling.
        """
        self._build_optimizer_before_tracing()
        return super().make_train_function(force)

    def _build_optimizer_before_tracing(self):
        optimizer = getattr(self, "optimizer", None)
        if (
            builds_optimizer_before_tracing()
            and optimizer is not None
            and not optimizer.built
            and getattr(self, "_distribute_strategy", None) is None
        ):
            optimizer.build(self.trainable_variables)

    def train_step(self, *args, **kwargs):
        # PyTorch processes launched together (keras_transformer.distribution)
        # run Keras's step through DistributedDataParallel.
        from keras_transformer import distribution

        with direct_calls_where_eager():
            if distribution.torch_is_distributed():
                return distribution.torch_ddp_train_step(self, *args, **kwargs)
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with direct_calls_where_eager():
            return super().test_step(*args, **kwargs)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras's weight quantization (`keras.Model.quantize`), of the
        backbone: `model.quantize("int8")` stores every projection and the
        shared embedding in int8 with a scale per output channel, for
        smaller models in memory. The preprocessor has no weights (Keras's
        own `quantize` stops at its unbuilt tokenizer).

        Quantize after loading and before translating; the decoding
        functions are compiled again for the new weights. See
        docs/decoding.md for the BLEU and speed it gives.
        """
        with warnings.catch_warnings(), one_garbage_collection():
            # Keras names every layer without weights to quantize (dropout,
            # LayerNorm, positions): nothing the user can act on.
            warnings.filterwarnings("ignore", message=r"Layer .* does not have a `quantize` method")
            self.backbone.quantize(mode, config=config, filters=filters, **kwargs)
        # Compiled decoding and keras-hub generate functions hold the old
        # variables (JAX compiles with the variable list as an input).
        forget_decoding_functions(self)
        self.generate_function = None

    @property
    def special_token_ids(self):
        """The `SpecialTokenIds` (pad, start, end, unk, source start) of the
        preprocessor's tokenizer; this package's defaults without one."""
        return special_token_ids(getattr(self.preprocessor, "tokenizer", None))

    @property
    def _pad_id(self):
        return self.special_token_ids.pad

    # === Incremental decoding (section 6.1) ===
    # The interface that decoding reads (`decoding.interface.Seq2SeqDecodingModel`).

    def encode(self, encoder_token_ids, encoder_padding_mask):
        """The encoder output for a batch of sources."""
        return self.backbone.encode(encoder_token_ids, encoder_padding_mask)

    def cross_attention_cache(self, encoder_output):
        """The encoder output's keys and values, per decoder layer (see
        `TransformerBackbone.cross_attention_cache`)."""
        return self.backbone.cross_attention_cache(encoder_output)

    def empty_self_attention_cache(self, batch_size, max_length, beams=None):
        """Zeroed self-attention key/value caches, one `(keys, values)` per
        decoder layer, each `(batch_size, heads, max_length, d_k | d_v)`;
        with `beams`, caches that beam search never reorders, for
        `batch_size` sources of `beams` beams (`runtime.beam_cache`)."""
        return self.backbone.empty_self_attention_cache(batch_size, max_length, beams=beams)

    def initial_cache(self, encoder_output, max_length):
        """The decoding state of every decoder layer: an empty self-attention
        key/value cache of `max_length` positions, and the encoder output's
        keys and values for the encoder-decoder attention, computed once."""
        self_caches = self.empty_self_attention_cache(ops.shape(encoder_output)[0], max_length)
        return list(zip(self_caches, self.cross_attention_cache(encoder_output)))

    def call_decoder_with_cache(self, token_ids, index, cache, encoder_padding_mask):
        """One decoding step: the logits after `token_ids` at position `index`.

        Args:
            token_ids: int `(batch, 1)`, the tokens at position `index`.
            index: the position (scalar).
            cache: from `initial_cache` or a previous step.
            encoder_padding_mask: `(batch, source_length)`.

        Several tokens at once (`(batch, n)`, written at positions `index`
        to `index + n - 1`) fill the cache for a prompt; the logits are then
        those after the last of them.

        Returns:
            `(logits, cache)`: logits `(batch, vocabulary_size)` for the
            position after the last token, and the cache with the tokens'
            positions written.
        """
        hidden_states, cache = self.backbone.decode(
            token_ids, encoder_padding_mask=encoder_padding_mask, cache=cache, cache_index=index
        )
        return self.backbone.token_embedding(hidden_states[:, -1, :], reverse=True), cache

    def generate_step(self, inputs, stop_token_ids=None):
        """keras-hub's generation step, so that keras-hub's samplers run on
        this model (`generate(..., sampler=keras_hub.samplers.TopKSampler())`,
        see `keras_transformer.decoding.samplers`).

        The decoder prompt's positions are written into the key/value cache
        in one pass, then `self.sampler` extends it one cached step at a
        time, as keras-hub's own seq2seq models do. keras-hub's samplers have
        no length penalty; the paper's beam search is `generate(...,
        sampler="beam")`. As there, padding and start tokens are never
        sampled.

        Args:
            inputs: a dict of `encoder_token_ids`, `encoder_padding_mask`,
                `decoder_token_ids` and `decoder_padding_mask`; the decoder
                padding mask marks the prompt, which the sampler keeps.
            stop_token_ids: token ids that end an output.

        Returns:
            A dict of the generated `decoder_token_ids` and a
            `decoder_padding_mask` that ends after the first stop token.
        """
        return keras_hub_generate_step(self, inputs, stop_token_ids)

    def generate(
        self,
        inputs,
        sampler="beam",
        beam_size=4,
        alpha=0.6,
        max_length_offset=50,
        num_results=1,
        return_scores=False,
        batch_size=32,
        verbose=0,
        length_penalty="gnmt",
        ensemble=None,
        target_prefix=None,
        top_k=50,
        top_p=0.9,
        temperature=1.0,
        seed=0,
        source_language=None,
        target_language=None,
        split_sentences=False,
        format="text",
        no_repeat_ngram_size=0,
    ):
        """Translates sources with the key/value cache (section 6.1).

        Args:
            inputs: a string or a list of strings (bytes, NumPy string
                arrays and string tensors too; needs the preprocessor), the
                same as `{"encoder_text": ...}`, or a dict with
                `encoder_token_ids` and `encoder_padding_mask`.
            sampler: `"beam"` (the paper), `"greedy"`, or `"top_k"` /
                `"top_p"`: a draw from the model's distribution at each
                step, after `temperature`, among its `top_k` most probable
                tokens or the fewest whose probabilities sum to `top_p`,
                with `seed` (`keras_transformer.decoding.sampling`; with
                scores and ensembles, as beam search). Or a keras-hub
                `Sampler` instance (such as `keras_hub.samplers.TopKSampler`),
                which runs keras-hub's generate loop through `generate_step`:
                no length penalty and no scores (`beam_size`, `alpha`,
                `num_results` and `return_scores` do not apply).
            beam_size: beams per source (the paper: 4).
            alpha: length penalty exponent (the paper: 0.6).
            max_length_offset: at most source length + this many output
                tokens (the paper: 50).
            num_results: hypotheses returned per source (beam search).
            return_scores: return `(output, score)` pairs, the score being
                log P / lp for beam search and log P for greedy decoding.
            batch_size: sources translated together; sources of similar
                length are batched together.
            verbose: 1 shows a progress bar (Keras's), 0 nothing.
            length_penalty: how beam search divides log P by the length:
                `"gnmt"` (the paper's, ((5 + |Y|) / 6) ** alpha) or
                `"length"` (|Y| ** alpha, as Hugging Face transformers and
                Marian rank hypotheses).
            ensemble: other models sharing this model's vocabulary, decoded
                together with it: each step ranks tokens by the models' mean
                probability (`keras_transformer.decoding.Ensemble`). None
                (the default): the `ensemble_members` of the ensemble preset
                the model came from, if any (keras-hub samplers: none);
                `[]`: this model alone.
            target_prefix: what every output starts with, forced at the
                first steps (CTranslate2's `target_prefix`, transformers'
                `forced_bos_token_id`): text (tokenized without start or
                end token) or token ids. It is part of the output, and its
                tokens' log-probability counts as 0.
            top_k, top_p, temperature, seed: the sampling's settings
                (`sampler="top_k"` or `"top_p"`); a source's sample is a
                function of the source and the seed.
            source_language, target_language: for multilingual models
                (M2M100, NLLB-200; opus-mt's `>>xx<<` target tokens): a
                code as the model names it (`"__de__"`, `"deu_Latn"`) or an
                ISO 639-1 / 639-3 code naming one (`"de"`, `"deu"`); see
                `languages`. The target code is forced first (before
                `target_prefix`); without it, the tokenizer's own.
            split_sentences: translate each text as a document: its
                sentences (found by sentencex, in the source language) are
                translated, all texts' together in batches, and put back
                in place, line breaks and whitespace kept; a sentence
                longer than the model reads is split at `;:,` or between
                words (`keras_transformer.documents.Document`).
            format: `"text"`, or `"html"`: tags are kept, text nodes and
                the attributes written for readers (`alt`, `title`, ...)
                translated (not `<script>`, `<style>` or what is marked
                `translate="no"`), and the translations escaped as the
                page escaped its text; a sentence that inline elements
                (`<b>`, `<a>`, ...) cut is translated whole and their tags
                put around the words their words became (a word alignment
                from the model's attention: `documents/inline.py`).
            no_repeat_ngram_size: n > 0: no output repeats n tokens (a
                guard against degenerate repetition, as fairseq's and
                transformers'); 0: off.

        Returns:
            For string inputs, strings; for token ids, lists of ids. With
            `num_results > 1` or `return_scores`, each source gets a list of
            `(output, score)` pairs, best first. An empty or blank source
            gives an empty output.
        """
        return generation.generate(
            self, inputs, task_class=TransformerSeq2SeqLM, sampler=sampler, beam_size=beam_size, alpha=alpha,
            max_length_offset=max_length_offset, num_results=num_results, return_scores=return_scores,
            batch_size=batch_size, verbose=verbose, length_penalty=length_penalty, ensemble=ensemble,
            target_prefix=target_prefix, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed,
            source_language=source_language, target_language=target_language,
            split_sentences=split_sentences, format=format, no_repeat_ngram_size=no_repeat_ngram_size,
        )

    @property
    def languages(self):
        """The language codes a multilingual model translates between, as
        it names them (`["__af__", ...]`, `["ace_Arab", ...]`); `[]` for a
        model of one language pair.

        Example:

        ```python
        model = TransformerSeq2SeqLM.from_preset("hf://facebook/nllb-200-distilled-600M")
        len(model.languages)  # 202
        ```
        """
        return model_languages(getattr(self.preprocessor, "tokenizer", None))

    def target_prefix_ids(self, target_prefix):
        """`generate`'s `target_prefix` as token ids: ids as they are, text
        through the tokenizer (its pieces, no start or end token), None as
        no prefix."""
        return generation.target_prefix_ids(self.preprocessor, target_prefix)

