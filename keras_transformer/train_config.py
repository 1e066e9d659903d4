"""The settings of a Multi30k training run, declared once.

Each setting of `train_multi30k` (and `keras-transformer train`) is one
field of `TrainConfig`: its default, its help text, and whether a resumed run
must keep it. From them come the command line's options
(`add_arguments`), the check that a resumed run keeps its settings
(`fixed_settings`) and the settings recorded in the run's `run.json`.
"""

import argparse
import dataclasses

from keras_transformer.utils import arguments


def setting(default, help, fixed=False, scratch_only=False, flag=None, cli=True, **argparse_kwargs):
    """A `TrainConfig` field.

    Args:
        default: the default value.
        help: the command line's help text.
        fixed: a resumed run must keep it (it makes the run's vocabulary,
            weights, batches or schedule).
        scratch_only: only a run from scratch has it (a run from a preset
            has the preset's); recorded as None for a run from a preset.
        flag: the command line option, if not `--` plus the name with
            dashes.
        cli: whether the command line has an option for it.
        **argparse_kwargs: `type`, `choices`, `metavar` of the option.
    """
    metadata = dict(help=help, fixed=fixed, scratch_only=scratch_only, flag=flag, cli=cli, argparse=argparse_kwargs)
    return dataclasses.field(default=default, metadata=metadata)


# Backbone arguments that the command line can override (train_multi30k
# takes any backbone argument).
BACKBONE_OPTIONS = {
    "num_layers": (arguments.positive_int, "override N"),
    "d_model": (arguments.positive_int, "override d_model"),
    "d_ff": (arguments.positive_int, "override d_ff"),
    "num_heads": (arguments.positive_int, "override h"),
    "dropout": (arguments.probability, "override P_drop"),
}
# Backbone arguments a run from a preset may change: the others shape its
# weights.
PRESET_OVERRIDES = ("dropout", "attention_dropout")


@dataclasses.dataclass
class TrainConfig:
    """The settings of `train_multi30k` (see there for how a run uses them).

    Example:

    >>> config = TrainConfig(source="de", target="en", epochs=3)
    >>> config.fixed_settings()["source"], "epochs" in config.fixed_settings()
    ('de', False)
    """

    source: str = setting("en", "source language (default: en)", fixed=True)
    target: str = setting("de", "target language (default: de)", fixed=True)
    data_dir: str = setting(None, "local Multi30k directory (default: $KERAS_TRANSFORMER_MULTI30K or download)")
    config: str = setting(
        "small", "model size: small, tiny, base, big or a Table 3 row", fixed=True, scratch_only=True
    )
    vocabulary_size: int = setting(
        8000, "size of the shared subword vocabulary", fixed=True, scratch_only=True, type=arguments.positive_int
    )
    tokenizer_algorithm: str = setting(
        "bpe", "SentencePiece algorithm", fixed=True, scratch_only=True, flag="--tokenizer",
        choices=["bpe", "unigram"],
    )
    max_tokens: int = setting(4096, "token budget per batch", fixed=True, type=arguments.positive_int)
    pad_to_multiple_of: int = setting(
        1, "round batch lengths up (fewer shapes for JAX to compile)", fixed=True, type=arguments.positive_int
    )
    epochs: int = setting(20, "passes over the training data", type=arguments.positive_int)
    steps: int = setting(
        None, "train about this many steps instead of --epochs (rounded up to whole epochs of at most one pass)",
        type=arguments.positive_int,
    )
    warmup_steps: int = setting(4000, "warm-up steps of the schedule", fixed=True, type=arguments.positive_int)
    learning_rate_scale: float = setting(
        1.0, "factor on the schedule", fixed=True, type=arguments.positive_float
    )
    label_smoothing: float = setting(
        None, "eps_ls (default: the config's Table 3 value: 0.0 for D3, 0.2 for D4, else 0.1)", fixed=True,
        type=arguments.probability,
    )
    dtype: str = setting(
        "float32", "compute precision: mixed_bfloat16 runs the matrix products in bfloat16 with float32 weights, "
        "softmax, LayerNorm, logits and loss; checkpoints and the saved model stay float32", choices=["float32", "mixed_bfloat16"],
    )
    max_sequence_length: int = setting(256, "the model's longest sequence", cli=False)
    keep_checkpoints: int = setting(5, "checkpoints averaged at the end", type=arguments.positive_int)
    bleu_sentences: int = setting(200, "val sentences for BLEU each epoch", type=arguments.non_negative_int)
    limit: int = setting(None, "use only the first N training pairs", fixed=True, type=arguments.positive_int)
    validation_limit: int = setting(None, "use only the first N validation pairs", cli=False)
    seed: int = setting(0, "random seed", fixed=True, type=int)
    initial_preset: str = setting(
        None, "start from this preset (name or directory) instead of from scratch: fine-tune it, or train it "
        "longer; keeps its architecture and vocabulary", flag="--from-preset", metavar="PRESET",
    )
    source_language: str = setting(
        None, "with --from-preset of a multilingual model (M2M100, NLLB-200): the sources' language code as the "
        "model names it (eng_Latn, __en__; default: the model's code for --source)", fixed=True, metavar="CODE",
    )
    target_language: str = setting(
        None, "with --from-preset of a multilingual model: the targets' language code (default: the model's code "
        "for --target); the trained model translates into it by default", fixed=True, metavar="CODE",
    )
    initial_step: int = setting(
        None, "the learning-rate schedule's first step (default: 0, or with --from-preset the steps the preset "
        "was trained for)", fixed=True, type=int,
    )

    @classmethod
    def split(cls, kwargs):
        """`(TrainConfig, backbone_overrides)` of `train_multi30k`'s
        keyword arguments: the fields, and the rest (backbone arguments)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names}), {
            k: v for k, v in kwargs.items() if k not in names
        }

    def check(self):
        """Refuses a setting out of its range, as the command line's
        option would ("max_tokens must be 1 or more, got 0"), before a run
        writes anything."""
        for field in dataclasses.fields(self):
            check = field.metadata["argparse"].get("type")
            value = getattr(self, field.name)
            if value is None:
                continue
            try:
                check and check(str(value))
            except (argparse.ArgumentTypeError, ValueError) as error:
                raise ValueError(f"{field.name} {error}.") from None
            choices = field.metadata["argparse"].get("choices")
            if choices and value not in choices:
                raise ValueError(f"{field.name} must be one of {choices}, got {value!r}.")

    def fixed_settings(self):
        """The settings a resumed run must keep, as its run.json records
        them: None for those a run from a preset takes from the preset
        (its vocabulary size is not recorded then), and no `initial_step`
        while it is not set."""
        settings = {}
        for field in dataclasses.fields(self):
            if not field.metadata["fixed"]:
                continue
            value = getattr(self, field.name)
            if field.metadata["scratch_only"] and self.initial_preset:
                if field.name == "vocabulary_size":
                    continue
                value = None
            if field.name == "initial_step" and value is None:
                continue
            settings[field.name] = value
        return settings


def fixed_setting_names():
    """The names of the settings a resumed run must keep."""
    return tuple(field.name for field in dataclasses.fields(TrainConfig) if field.metadata["fixed"])


def add_arguments(parser):
    """Adds an option for each command-line field of `TrainConfig`, and the
    backbone overrides of `BACKBONE_OPTIONS`, to an argparse parser, with
    the fields' defaults."""
    for field in dataclasses.fields(TrainConfig):
        if not field.metadata["cli"]:
            continue
        flag = field.metadata["flag"] or "--" + field.name.replace("_", "-")
        help = field.metadata["help"]
        if field.default is not None and "default:" not in help:
            help = f"{help} (default: {field.default})"
        parser.add_argument(flag, dest=field.name, default=field.default, help=help, **field.metadata["argparse"])
    for name, (type, help) in BACKBONE_OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=type, help=help)


def from_arguments(args):
    """`train_multi30k` keyword arguments from parsed `add_arguments`
    options: every field, and the backbone overrides given."""
    settings = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainConfig) if field.metadata["cli"]}
    settings.update({name: getattr(args, name) for name in BACKBONE_OPTIONS if getattr(args, name) is not None})
    return settings
