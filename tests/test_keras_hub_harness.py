"""keras-hub's own checks of its model families, run on this package's.

keras-hub tests each of its families with the harness of
`keras_hub.src.tests.test_case.TestCase`; here the same harness runs on
every family and preset kind of this package, on every backend, on tiny
models (one layer, d_model 16) built once a test class, without Multi30k:

- the paper's family (`TransformerBackbone`, `TransformerTokenizer`):
  backbone (with mixed precision), tokenizer, preprocessor, task, model
  saving and preset;
- Marian (an opus-mt checkpoint's directory, converted as it loads):
  backbone, tokenizer, preprocessor, task, model saving and preset;
- M2M100 (a fairseq checkpoint's directory, converted as it loads):
  backbone, tokenizer, preprocessor, model saving and preset;
- an ensemble preset (two models) and a preset of int8 weights
  (`weights_storage="int8"`): preset.

`run_task_test` includes `fit` after keras-hub's split preprocessing
(`task.preprocessor = None`, then set back), which failed on PyTorch while
the tokenizers had a `train` classmethod (see `test_layer_names.py`).

What is not run, and why:

- keras-hub's quantization check (`run_quantization_test`, part of
  `run_backbone_test`) selects the layers to quantize by their exact type
  (`keras.layers.Dense`, `EinsumDense`, `Embedding`, `ReversibleEmbedding`);
  this package's layers are subclasses of those, so it would quantize
  nothing and pass. `test_quantization_by_dtype_policy_map` runs its steps
  on the layers selected by `isinstance` instead. (keras-hub skips it on
  PyTorch, and the mixed-precision check on PyTorch's CPU: so do these.)
- The mixed-precision check on Marian and M2M100: their backbones are the
  paper's class, built of the same layers, with other options (activation,
  logits bias, pre-norm, positions); the check runs on the paper's backbone
  (and `test_precision.py` checks mixed precision further). On JAX it costs
  seconds a family.
- `run_task_test` on M2M100: its task and preprocessor run the code that
  Marian's run does (`M2M100Tokenizer` extends `MarianTokenizer`; targets go
  through `tokenize_target`); only its backbone options differ, which
  `run_backbone_test` checks; on JAX it is the costliest check.
- Everything but `run_preset_test` on the ensemble preset: the harness
  builds tasks from constructor arguments (`cls(**init_kwargs)`) and checks
  `get_config` round trips and `.keras` files, while an ensemble's further
  models are neither constructor arguments nor config: they are separate
  models, saved as presets beside the first (`save_to_preset`) and loaded
  by `from_preset`, which `run_preset_test` runs (with and without weights).
- Everything but `run_preset_test` on the int8 preset: int8 storage is a
  preset's way of storing weights; the model it loads is a float
  `TransformerBackbone` with the paper's tokenizer, which the paper's
  family's checks cover.
"""

import os
import shutil
import tempfile

import keras
import pytest

pytest.importorskip("grain")  # keras-hub's test module imports it
transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from keras_hub.src.tests import test_case  # noqa: E402

import tiny_spm  # noqa: E402
from m2m100_fixture import save_tiny  # noqa: E402
from marian_fixture import tiny_marian_dir  # noqa: E402

from keras_transformer.models import M2M100Tokenizer  # noqa: E402
from keras_transformer.models import MarianTokenizer  # noqa: E402
from keras_transformer.models import TransformerBackbone  # noqa: E402
from keras_transformer.models import TransformerSeq2SeqLM  # noqa: E402
from keras_transformer.models import TransformerSeq2SeqLMPreprocessor  # noqa: E402
from keras_transformer.models import TransformerTokenizer  # noqa: E402

LENGTH = 32  # the preprocessors' sequence lengths: the pairs below fit
PAIRS = ({"encoder_text": tiny_spm.SOURCES[1:5], "decoder_text": tiny_spm.TARGETS[1:5]},)
TINY = dict(num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0, max_sequence_length=LENGTH)
# The layers Keras quantizes (`keras.Model.quantize`), and Embedding in int8.
QUANTIZED = (keras.layers.Dense, keras.layers.EinsumDense)
# The same size for the checkpoints that transformers writes (Marian, M2M100).
SMALLEST = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=32, decoder_ffn_dim=32)


class HarnessTestCase(test_case.TestCase):
    test_session = None  # (TensorFlow's test case's, deprecated: not a test)


class PresetChecks:
    """keras-hub's `run_preset_test` on every class of the preset at
    `self.preset`, which `make_preset(directory)` writes once a class."""

    tokenizer_cls = TransformerTokenizer

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._directory = tempfile.mkdtemp(prefix="keras-hub-harness-")
        cls.preset = cls.make_preset(os.path.join(cls._directory, "preset"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls._directory, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        # (After the seeds are set: setting TensorFlow's clears the kernel
        # cache that holds a SentencePiece tokenizer's resource.)
        super().setUp()
        self.preprocessor = TransformerSeq2SeqLMPreprocessor.from_preset(
            self.preset, encoder_sequence_length=LENGTH, decoder_sequence_length=LENGTH
        )
        self.input_data = self.preprocessor(*PAIRS)[0]

    def test_preset(self):
        for cls, data in (
            (TransformerSeq2SeqLM, self.input_data),
            (TransformerBackbone, self.input_data),
            (TransformerSeq2SeqLMPreprocessor, PAIRS),
            (self.tokenizer_cls, PAIRS[0]["encoder_text"]),
        ):
            self.run_preset_test(cls=cls, preset=self.preset, input_data=data)


class TaskChecks:
    """keras-hub's `run_task_test` on the task of the preset's backbone
    and preprocessor."""

    def test_task(self):
        backbone = TransformerBackbone.from_preset(self.preset)
        self.run_task_test(
            cls=TransformerSeq2SeqLM,
            init_kwargs={"backbone": backbone, "preprocessor": self.preprocessor},
            train_data=PAIRS,
            expected_output_shape=(len(PAIRS[0]["encoder_text"]), LENGTH, backbone.vocabulary_size),
        )


class FamilyChecks:
    """keras-hub's `run_backbone_test` and `run_preprocessor_test` on a
    family's classes, with the preset's backbone config and tokenizer."""

    dtype_checks = False  # keras-hub's mixed precision and quantization checks

    def test_backbone(self):
        config = TransformerBackbone.from_preset(self.preset).get_config()
        config.pop("name")
        rows = len(PAIRS[0]["encoder_text"])
        self.run_backbone_test(
            cls=TransformerBackbone,
            init_kwargs=config,
            input_data=self.input_data,
            expected_output_shape={
                "encoder_sequence_output": (rows, LENGTH, config["d_model"]),
                "decoder_sequence_output": (rows, LENGTH, config["d_model"]),
            },
            run_mixed_precision_check=self.dtype_checks,
            run_quantization_check=self.dtype_checks,
        )

    def test_preprocessor(self):
        # (The harness reads `self.init_kwargs`, as keras-hub's tests set it.)
        self.init_kwargs = {
            "tokenizer": self.preprocessor.tokenizer,
            "encoder_sequence_length": LENGTH,
            "decoder_sequence_length": LENGTH,
        }
        self.run_preprocessor_test(
            cls=TransformerSeq2SeqLMPreprocessor,
            init_kwargs=self.init_kwargs,
            input_data=PAIRS,
            token_id_key="decoder_token_ids",
        )

    def test_tokenizer(self):
        tokenizer = self.preprocessor.tokenizer
        self.run_preprocessing_layer_test(
            cls=self.tokenizer_cls,
            init_kwargs=self.tokenizer_kwargs(tokenizer),
            input_data=PAIRS[0]["encoder_text"],
        )

    def test_model_saving(self):
        self.run_model_saving_test(
            cls=TransformerSeq2SeqLM,
            init_kwargs={"backbone": TransformerBackbone.from_preset(self.preset), "preprocessor": self.preprocessor},
            input_data=self.input_data,
        )


def _paper_preset(directory, **save):
    tokenizer = TransformerTokenizer.from_texts(tiny_spm.SOURCES + tiny_spm.TARGETS, vocabulary_size=400)
    backbone = TransformerBackbone(tokenizer.vocabulary_size(), **TINY)
    TransformerSeq2SeqLM(backbone, TransformerSeq2SeqLMPreprocessor(tokenizer, LENGTH, LENGTH)).save_to_preset(
        directory, **save
    )
    return directory


class PaperFamilyTest(TaskChecks, FamilyChecks, PresetChecks, HarnessTestCase):
    make_preset = staticmethod(_paper_preset)
    dtype_checks = True

    @staticmethod
    def tokenizer_kwargs(tokenizer):
        return {"proto": tokenizer.proto}

    def test_quantization_by_dtype_policy_map(self):
        """keras-hub's `run_quantization_test`, its layers chosen with
        `isinstance` (see the module's docstring): a backbone built with
        a `DTypePolicyMap` that quantizes them computes in int8 (float8),
        and its config and weights round trip."""
        if keras.config.backend() == "torch":
            self.skipTest("keras-hub's quantization check does not run on PyTorch")
        config = TransformerBackbone.from_preset(self.preset).get_config()
        float_backbone = TransformerBackbone.from_config(config)
        for mode, kinds in (("int8", QUANTIZED + (keras.layers.Embedding,)), ("float8", QUANTIZED)):
            policies = keras.dtype_policies.DTypePolicyMap("float32")
            for layer in float_backbone._flatten_layers():
                if isinstance(layer, kinds):
                    policies[layer.path] = keras.dtype_policies.get(f"{mode}_from_float32")
            backbone = TransformerBackbone.from_config({**config, "dtype": policies})
            backbone(self.input_data)
            layers = [layer for layer in backbone._flatten_layers() if isinstance(layer, kinds)]
            self.assertNotEmpty(layers)
            self.assertEqual([layer.quantization_mode for layer in layers], [mode] * len(layers))
            revived = TransformerBackbone.from_config(backbone.get_config())
            self.assertEqual(revived.get_config(), backbone.get_config())
            revived.set_weights(backbone.get_weights())


class MarianFamilyTest(TaskChecks, FamilyChecks, PresetChecks, HarnessTestCase):
    """An opus-mt checkpoint's directory, converted as it loads."""

    tokenizer_cls = MarianTokenizer

    @staticmethod
    def make_preset(directory):
        return tiny_marian_dir(directory, tiny_spm.SOURCES, tiny_spm.TARGETS, train_steps=0, **SMALLEST)

    @staticmethod
    def tokenizer_kwargs(tokenizer):
        return {key: getattr(tokenizer, key) for key in ("source_spm", "target_spm", "vocabulary")}


class M2M100FamilyTest(FamilyChecks, PresetChecks, HarnessTestCase):
    """A fairseq M2M100 checkpoint's directory, converted as it loads."""

    tokenizer_cls = M2M100Tokenizer

    @staticmethod
    def tokenizer_kwargs(tokenizer):
        keys = ("language_codes", "source_language", "target_language")
        return {"spm": tokenizer.source_spm, "vocabulary": tokenizer.vocabulary,
                **{key: getattr(tokenizer, key) for key in keys}}

    @staticmethod
    def make_preset(directory):
        return save_tiny(directory, "m2m100", **SMALLEST)


class Int8PresetTest(PresetChecks, HarnessTestCase):
    @staticmethod
    def make_preset(directory):
        return _paper_preset(directory, weights_storage="int8")


class EnsemblePresetTest(PresetChecks, HarnessTestCase):
    @staticmethod
    def make_preset(directory):
        first = TransformerSeq2SeqLM.from_preset(_paper_preset(directory + "-first"))
        second = TransformerBackbone(first.backbone.vocabulary_size, **{**TINY, "num_layers": 2})
        first.set_ensemble_members([TransformerSeq2SeqLM(second, first.preprocessor)])
        first.save_to_preset(directory)
        return directory

    def test_preset(self):
        super().test_preset()
        self.assertLen(TransformerSeq2SeqLM.from_preset(self.preset).ensemble_members, 1)
