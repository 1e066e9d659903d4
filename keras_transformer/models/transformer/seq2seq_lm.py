"""The translation task: the backbone, the pre-softmax projection, the paper's
training recipe (section 5) and decoding (section 6.1)."""

import contextlib
import gc
import os
import warnings

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.interface import forget_decoding_functions
from keras_transformer.decoding.settings import SAMPLINGS
from keras_transformer.decoding.settings import DecodingSettings
from keras_transformer.decoding.samplers import keras_hub_generate_step
from keras_transformer.decoding.samplers import sample
from keras_transformer.layers.direct_calls import direct_calls
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import TokenAccuracy
from keras_transformer.models.preset_io import PresetIO
from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.models.transformer.ensemble_members import load_members
from keras_transformer.models.transformer.seq2seq_lm_preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.models.transformer.seq2seq_lm_preprocessor import source_texts
from keras_transformer.models.transformer.special_tokens import special_token_ids
from keras_transformer.presets import ensembles
from keras_transformer.presets.layout import ENSEMBLE_KEY
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.registry import preset_metadata
from keras_transformer.presets.saving import saving
from keras_transformer.schedules import paper_optimizer
from keras_transformer.utils.arguments import check_model_keywords

# Data that `fit`, `evaluate` and `predict` take as it is in memory (not a
# dataset): checked by the preprocessor first, and shuffled by `fit`.
IN_MEMORY = (dict, list, tuple, np.ndarray)


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLM(PresetIO, keras_hub.models.Seq2SeqLM):
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
    tokenizer = TransformerTokenizer.train(sources + targets, 8000)
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
        """
        in_memory = isinstance(x, IN_MEMORY)
        self._check_in_memory(x, y, "fit")
        self._check_validation_data(validation_data)
        if in_memory and (shuffle or validation_split):
            import tensorflow as tf

            samples = tf.data.Dataset.from_tensor_slices(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))
            batch_size = batch_size or 32
            if validation_split and validation_data is None:
                samples, validation_data = _split_off_validation(samples, validation_split, batch_size)
            if shuffle:
                samples = samples.shuffle(int(samples.cardinality()), reshuffle_each_iteration=True)
            x, y, sample_weight, batch_size = samples.batch(batch_size), None, None, None
            validation_split = None
        return super().fit(
            x,
            y,
            batch_size=batch_size,
            sample_weight=sample_weight,
            validation_data=validation_data,
            validation_split=validation_split,
            shuffle=False,
            **kwargs,
        )

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self._check_in_memory(x, y, "evaluate")
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x=None, *args, **kwargs):
        self._check_in_memory(x, None, "predict")
        return super().predict(x, *args, **kwargs)

    def _check_in_memory(self, x, y, method, what=None):
        """The preprocessor's checks of sentence pairs held in memory, run
        here rather than inside `tf.data` (whose traceback buries them);
        `what` names the argument checked, if not the data itself."""
        check_inputs = getattr(self.preprocessor, "check_inputs", None)
        if check_inputs is None or not isinstance(x, (*IN_MEMORY, str)):
            return
        try:
            check_inputs(x, y)
        except ValueError as error:
            # Sources alone, not sentence pairs: perhaps meant for translation.
            to_translate = method != "fit" and not isinstance(x, dict) and y is None
            hint = " To translate sources, call generate(sources)." if to_translate else ""
            raise ValueError(f"{method}: {what + ': ' if what else ''}{error}{hint}") from None

    def _check_validation_data(self, validation_data):
        """`fit`'s `validation_data` held in memory: a dict of sentence
        pairs, or Keras' `(x, y)` / `(x, y, sample_weight)` tuple."""
        if isinstance(validation_data, bool):  # `shuffle` given fifth, where keras-hub has validation_data
            raise ValueError(
                f"fit: validation_data={validation_data}: fit takes keras-hub's order (x, y, batch_size, "
                "sample_weight, validation_data); give shuffle by name: fit(..., shuffle=False)."
            )
        if isinstance(validation_data, (list, tuple)) and 1 <= len(validation_data) <= 3:  # as Keras unpacks
            x, y, _ = keras.utils.unpack_x_y_sample_weight(validation_data)
        else:
            x, y = validation_data, None
        self._check_in_memory(x, y, "fit", what="validation_data")

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
            keras.config.backend() == "tensorflow"
            and optimizer is not None
            and not optimizer.built
            and getattr(self, "_distribute_strategy", None) is None
        ):
            optimizer.build(self.trainable_variables)

    def train_step(self, *args, **kwargs):
        # PyTorch processes launched together (keras_transformer.distribution)
        # run Keras's step through DistributedDataParallel.
        from keras_transformer import distribution

        with _eager_direct_calls():
            if distribution.torch_is_distributed():
                return distribution.torch_ddp_train_step(self, *args, **kwargs)
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with _eager_direct_calls():
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
        with warnings.catch_warnings(), _one_garbage_collection():
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
        `batch_size` sources of `beams` beams (`layers.beam_cache`)."""
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

        Returns:
            For string inputs, strings; for token ids, lists of ids. With
            `num_results > 1` or `return_scores`, each source gets a list of
            `(output, score)` pairs, best first. An empty or blank source
            gives an empty output.
        """
        keras_hub_sampler = isinstance(sampler, keras_hub.samplers.Sampler)
        if not keras_hub_sampler and sampler not in ("beam", "greedy", *SAMPLINGS):
            raise ValueError(
                f"Unknown sampler {sampler!r}; available: 'beam', 'greedy', 'top_k', 'top_p', or a "
                "keras_hub.samplers.Sampler instance."
            )
        if ensemble is None:
            # keras-hub's samplers decode one model: an ensemble preset's first.
            ensemble = [] if keras_hub_sampler else self.ensemble_members
        ensemble = _check_models(ensemble)
        if keras_hub_sampler and (num_results > 1 or return_scores or ensemble or target_prefix is not None):
            raise ValueError(
                "keras-hub samplers give no scores, n-best lists or ensembles, and take no target prefix; "
                "use sampler='beam'."
            )
        _check_counts(batch_size=batch_size)
        if sampler in ("greedy", *SAMPLINGS) and num_results > 1:
            what = "Greedy decoding" if sampler == "greedy" else "Sampling"
            raise ValueError(f"{what} gives one result; num_results={num_results} needs sampler='beam'.")
        settings = DecodingSettings(
            beam_size=beam_size, alpha=alpha, length_penalty=length_penalty, max_length_offset=max_length_offset,
            num_results=num_results, target_prefix=self.target_prefix_ids(target_prefix),
        )
        if sampler in ("greedy", *SAMPLINGS):
            settings = settings.replace(beam_size=1, alpha=0.0)
        if sampler in SAMPLINGS:
            settings = settings.replace(sampling=sampler, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed)
        sources, decode, single = self._generate_sources(inputs)
        if keras_hub_sampler:
            outputs = decode(list(sample(self, sources, sampler, max_length_offset, batch_size)))
            return outputs[0] if single else outputs
        decoder = self._ensemble_with(ensemble) if ensemble else self
        results = _search_in_batches(decoder, sources, settings, batch_size, verbose)
        if num_results > 1 or return_scores:
            # An empty source gives one empty result of score 0.
            results = [result or [([], 0.0, None)] for result in results]
            texts = iter(decode([ids for result in results for ids, _, _ in result]))
            outputs = [[(next(texts), score) for _, score, _ in result] for result in results]
        else:
            outputs = decode([result[0][0] if result else [] for result in results])
        return outputs[0] if single else outputs

    def _generate_sources(self, inputs):
        """`generate`'s inputs as `(sources, decode, single)`: token id
        lists, the function that turns outputs back (detokenizes, or keeps
        ids for ids), and whether one string was given."""
        if isinstance(inputs, dict) and set(inputs) == {"encoder_text"}:  # as `fit` takes them
            inputs = inputs["encoder_text"]
        if not isinstance(inputs, dict):
            texts, single = source_texts(inputs)
            return self._tokenize_sources(texts), self._detokenize, single
        if not {"encoder_token_ids", "encoder_padding_mask"} <= set(inputs):
            raise ValueError(
                f"generate() got a dict with keys {sorted(inputs)}; it takes `encoder_text` (sources "
                "as strings) or `encoder_token_ids` with `encoder_padding_mask`. Decoder prompts "
                "(`decoder_text`, `decoder_token_ids`) are not supported: translations start from "
                "the start token; give target_prefix to force the first tokens."
            )
        return _source_ids(inputs, self.backbone.vocabulary_size), (lambda id_lists: id_lists), False

    def target_prefix_ids(self, target_prefix):
        """`generate`'s `target_prefix` as token ids: ids as they are, text
        through the tokenizer (its pieces, no start or end token), None as
        no prefix."""
        if target_prefix is None:
            return ()
        if isinstance(target_prefix, bytes):
            target_prefix = target_prefix.decode("utf-8")
        if not isinstance(target_prefix, str):
            return target_prefix
        if self.preprocessor is None:
            raise ValueError("target_prefix as text needs the model's preprocessor (its tokenizer); give token ids.")
        if not target_prefix.strip():
            raise ValueError("target_prefix is blank text; give the text (or token ids) the outputs start with.")
        return [int(token) for token in ops.convert_to_numpy(self.preprocessor.tokenizer(target_prefix))]

    @property
    def ensemble_members(self):
        """The other models of the ensemble preset this model was loaded
        from, which `generate` decodes with it by default ([] if none).

        They are kept apart from this model's layers and weights (`fit`
        trains this model alone); `save_to_preset` writes them with it.
        """
        return list(self.__dict__.get("_ensemble_members", ()))

    def set_ensemble_members(self, models):
        """Makes `models` (tasks on this model's vocabulary) the ensemble
        that `generate` and `save_to_preset` use; [] for this model alone.

        Example:

        ```python
        model = TransformerSeq2SeqLM.from_preset("runs/en-de-seed0/model")
        model.set_ensemble_members([TransformerSeq2SeqLM.from_preset("runs/en-de-seed1/model")])
        model.save_to_preset("en-de-ensemble")  # loads as the ensemble of both
        ```
        """
        models = list(models)
        nested = [i for i, model in enumerate(models) if getattr(model, "ensemble_members", None)]
        if nested:
            raise ValueError(
                f"Ensemble member {nested[0]} has ensemble members of its own; pass its models one by one: "
                "`[*others, member, *member.ensemble_members]`."
            )
        if models:
            Ensemble([self, *models])  # refuses models of another vocabulary
        # Set past Keras' and PyTorch's attribute tracking: the members'
        # weights are not this model's.
        object.__setattr__(self, "_ensemble_members", tuple(models))

    preset_keywords = ("load_ensemble",)

    @classmethod
    def from_preset(cls, preset, *args, load_ensemble=True, **kwargs):
        """Loads a preset (see `keras_transformer.presets`); of an ensemble
        preset, also its further models into `ensemble_members`, unless
        `load_ensemble=False` (its first model alone)."""
        model = super().from_preset(preset, *args, **kwargs)
        if isinstance(model, TransformerSeq2SeqLM):
            # What the model keeps of its preset's metadata.json: its
            # languages (`Ensemble` refuses models of others) and the
            # data's terms, which a save of the model (fine-tuned) writes
            # again.
            metadata = preset_metadata(preset) if "://" not in os.fspath(preset) else {}
            object.__setattr__(
                model, "_preset_metadata", {key: metadata[key] for key in _INHERITED_METADATA if key in metadata}
            )
        if isinstance(model, TransformerSeq2SeqLM) and load_ensemble:
            model.set_ensemble_members(load_members(
                model, preset, load_weights=kwargs.get("load_weights", True), dtype=kwargs.get("dtype")
            ))
        return model

    def save_to_preset(self, preset_dir, *args, metadata=None, **kwargs):
        """Saves the model (and its `ensemble_members`) as a preset (see
        `PresetIO.save_to_preset`). A model loaded from a preset keeps its
        languages and its data's terms (`languages`, `data_terms` in
        metadata.json) in the presets it saves; `metadata` may replace them."""
        members = self.ensemble_members
        # The list of members and the weights' storage are the save's to
        # write (metadata copied from an ensemble preset must not list
        # members this save lacks).
        metadata = {
            key: value
            for key, value in {**getattr(self, "_preset_metadata", {}), **(metadata or {})}.items()
            if key not in (ENSEMBLE_KEY, STORAGE_KEY)
        } or None
        if not members:
            return super().save_to_preset(preset_dir, *args, metadata=metadata, **kwargs)
        # One save: the members are written into the same staging directory,
        # so a save that fails leaves the preset there as it was.
        listed = {**(metadata or {}), ENSEMBLE_KEY: ensembles.member_directories(len(members))}
        with saving(preset_dir, listed) as directory:
            super().save_to_preset(directory, *args, metadata=metadata, **kwargs)
            ensembles.save_members(members, directory, kwargs.get("weights_storage", "float"))

    def _ensemble_with(self, others):
        """The `Ensemble` of this model and `others`, made again only when
        the models or their variables (quantization) change, so that its
        compiled decoding functions are reused from call to call."""
        models = [self, *others]
        key = tuple(id(variable) for model in models for variable in model.variables)
        made_for, ensemble = getattr(self, "_ensemble", (None, None))
        if made_for != key:
            ensemble = Ensemble(models)
            self._ensemble = (key, ensemble)
        return ensemble

    def _require_tokenizer(self):
        if self.preprocessor is None:
            raise ValueError(
                "This model has no preprocessor, so it cannot read text: pass "
                "token ids, or build it with a TransformerSeq2SeqLMPreprocessor."
            )
        return self.preprocessor.tokenizer

    def _tokenize_sources(self, texts):
        """Framed token ids of each source (see the preprocessor's
        `generate_preprocess`); [] for an empty text."""
        self._require_tokenizer()
        return self.preprocessor.generate_preprocess(texts, self.backbone.max_sequence_length)

    def _detokenize(self, id_lists):
        self._require_tokenizer()
        return self.preprocessor.generate_postprocess(id_lists)


# The entries of a preset's metadata.json that a model loaded from it
# writes into its own presets (`save_to_preset`): they stay true of the
# model after fine-tuning, unlike its scores or description.
_INHERITED_METADATA = ("languages", "data_terms")


def _search_in_batches(decoder, sources, settings, batch_size, verbose):
    """`beam_search` of `sources` (token id lists) `batch_size` at a time,
    sources of similar length together (less padding); the results in the
    order of the sources."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results = [None] * len(sources)
    progress = keras.utils.Progbar(len(sources), verbose=verbose, unit_name="sentence") if verbose else None
    for start in range(0, len(sources), batch_size):
        batch = order[start : start + batch_size]
        for i, result in zip(batch, beam_search(decoder, [sources[i] for i in batch], settings)):
            results[i] = result
        if progress is not None:
            progress.add(len(batch))
    return results


def _check_count(name, value, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")


def _check_counts(**counts):
    for name, value in counts.items():
        _check_count(name, value)


def _check_models(models):
    """`generate`'s `ensemble`: a list of translation models."""
    if isinstance(models, (str, bytes)) or not isinstance(models, (list, tuple)):
        raise TypeError(
            f"ensemble must be a list of TransformerSeq2SeqLM models, got {type(models).__name__}; "
            "load a preset with TransformerSeq2SeqLM.from_preset(...) and pass [model]."
        )
    for i, model in enumerate(models):
        if not isinstance(model, TransformerSeq2SeqLM):
            raise TypeError(
                f"ensemble[{i}] is a {type(model).__name__}, not a TransformerSeq2SeqLM; "
                "load it with TransformerSeq2SeqLM.from_preset(...)."
            )
    return list(models)


def _source_ids(inputs, vocabulary_size):
    """The unpadded token ids of each source of `generate`'s dict input,
    checked: integer ids of a (batch, length) array, inside the vocabulary,
    with a mask of the same shape."""
    ids = np.asarray(keras.ops.convert_to_numpy(inputs["encoder_token_ids"]))
    mask = np.asarray(keras.ops.convert_to_numpy(inputs["encoder_padding_mask"]))
    if ids.ndim != 2:
        raise ValueError(
            f"encoder_token_ids must have the shape (batch, length), got {ids.shape}"
            + ("; for one source, add a batch axis (ids[None])." if ids.ndim == 1 else ".")
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"encoder_token_ids must hold integers, got {ids.dtype}.")
    if mask.shape != ids.shape:
        raise ValueError(
            f"encoder_padding_mask has the shape {mask.shape}, encoder_token_ids {ids.shape}: "
            "they must have the same shape (a mask value for each id)."
        )
    mask = mask.astype(bool)
    outside = ids[mask & ((ids < 0) | (ids >= vocabulary_size))]
    if outside.size:
        raise ValueError(
            f"encoder_token_ids holds {outside[0]}, outside the vocabulary [0, {vocabulary_size}): "
            "ids must come from this model's tokenizer."
        )
    return [row[m].tolist() for row, m in zip(ids, mask)]


def _eager_direct_calls():
    """`direct_calls()` on PyTorch, which runs every layer call of every
    step eagerly: the step's layers skip Keras's per-call work. Where that
    work dominates, a float32 step took 2.55-2.61x as long as
    `torch.nn.Transformer`'s with it and 1.70-1.71x without
    (`benchmarks/step_overhead.py`). JAX and TensorFlow trace the step once
    per shape, so it changes nothing there.
    """
    return direct_calls() if keras.config.backend() == "torch" else contextlib.nullcontext()


@contextlib.contextmanager
def _one_garbage_collection():
    """Keras collects garbage after each variable that quantization
    replaces (`Layer.__delattr__`), 49 full collections for a 3+3-layer
    model and seconds in a process holding TensorFlow and a backend; one
    collection afterwards frees the same float32 buffers."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def _split_off_validation(samples, validation_split, batch_size):
    """The first pairs for training and the last `validation_split` of
    them, batched, for validation (Keras's `validation_split`)."""
    if not 0 < validation_split < 1:
        raise ValueError(f"validation_split must be between 0 and 1, got {validation_split}.")
    count = int(samples.cardinality())
    split_at = int(np.floor(count * (1 - validation_split)))
    if split_at in (0, count):
        raise ValueError(
            f"{count} training pairs are too few to split off validation_split={validation_split} of "
            "them for validation and keep some for training. Give more pairs or another validation_split."
        )
    return samples.take(split_at), samples.skip(split_at).batch(batch_size)
