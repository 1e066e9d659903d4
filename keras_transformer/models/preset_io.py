"""`from_preset` and `save_to_preset` of every class of the models, with
the checks of `keras_transformer.presets`.

`PresetIO` is mixed into the backbone, tokenizer, preprocessor and task
classes in front of their keras-hub base. Loading checks the preset first
(`keras_transformer.presets.check`) and converts the checkpoints of other
libraries, such as Marian's, with the format that recognizes them
(`keras_transformer.presets.formats`); saving goes through
`keras_transformer.presets.saving`, so that a save that fails halfway leaves
the directory as it was.
"""

import difflib
import os

import keras
import keras_hub

from keras_transformer.presets import formats
from keras_transformer.presets import hub
from keras_transformer.presets import int8
from keras_transformer.presets.checks import check
from keras_transformer.presets.checks import check_loaded
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import ENSEMBLE_DIR
from keras_transformer.presets.layout import PREPROCESSOR_FILE
from keras_transformer.presets.layout import PRESET_ENTRIES
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import TASK_FILE
from keras_transformer.presets.layout import TASK_WEIGHTS_FILE
from keras_transformer.presets.layout import TOKENIZER_FILE
from keras_transformer.presets.layout import WEIGHTS_ENTRIES
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.layout import weights_do_not_fit
from keras_transformer.presets.registry import resolve
from keras_transformer.presets.saving import saving
from keras_transformer.utils.arguments import constructor_keywords


class PresetIO:
    """`from_preset` and `save_to_preset` with the checks of the presets.

    Mixed into the backbone, tokenizer, preprocessor and task classes in
    front of their keras-hub base: loading checks the preset first (see
    `keras_transformer.presets.check`), saving goes through `saving`, and
    `save_to_preset` takes a `metadata` dict to record in `metadata.json`.
    """

    preset_needs = ("config",)
    preset_keywords = ()  # what a subclass's `from_preset` takes of its own

    @classmethod
    def from_preset(cls, preset, *args, **kwargs):
        # A hub handle without a network: an error within seconds that says
        # what to do (presets/hub.py).
        with hub.reading(preset):
            return cls._checked_from_preset(preset, *args, **kwargs)

    @classmethod
    def _checked_from_preset(cls, preset, *args, **kwargs):
        _check_keywords(cls, kwargs)
        _check_dtype(kwargs.get("dtype"))
        # Other libraries' checkpoints (Marian directories and hf://
        # handles) are converted by the format that recognizes them.
        load = None if args else formats.loader_of(preset)
        if load is not None:
            return load(cls, os.fspath(preset), **kwargs)
        load_weights = kwargs.get("load_weights", True)
        check(preset, cls.preset_needs, load_weights)
        directory = resolve(os.fspath(preset))
        # Weights stored in int8 load through keras-hub's loader too: it
        # passes their file to `TransformerBackbone.load_weights`.
        try:
            loaded = super().from_preset(directory, *args, **kwargs)
        except PresetError:
            raise
        except (TypeError, ValueError, KeyError) as error:
            if "://" in directory:
                raise
            if load_weights and _builds_without_weights(super(), directory, args, kwargs):
                # Keras refuses weights of other shapes than the config's.
                raise weights_do_not_fit(directory, f"{type(error).__name__}: {error}") from error
            # Keras' safe mode and deserialization refuse edited or crafted
            # configs with these: say which files, not a long traceback.
            raise PresetError(
                f"The preset {os.fspath(preset)!r} cannot be built from its config files ({CONFIG_FILE}, "
                f"{TASK_FILE}, {PREPROCESSOR_FILE}, {TOKENIZER_FILE}): {type(error).__name__}: {error}. "
                "They were edited or made by hand, or by another version: save the model again."
            ) from error
        backbone = getattr(loaded, "backbone", loaded)
        if load_weights and "://" not in directory and isinstance(backbone, keras_hub.models.Backbone):
            check_loaded(directory, backbone)
        if kwargs.get("compile", True) and getattr(loaded, "_compile_defaults_after_loading", False):
            # keras-hub compiles a task when it builds it, before it loads
            # the tokenizer's vocabulary: the default loss must ignore the
            # vocabulary's padding id, known only now.
            loaded.compile()
        return loaded

    def save_to_preset(self, preset_dir, *args, metadata=None, weights_storage="float", **kwargs):
        """Saves the model (or this part of it) as a preset in `preset_dir`.

        Args:
            preset_dir: the preset's directory.
            metadata: a dict to record in `metadata.json`.
            weights_storage: `"float"` (the default): the weights as the
                model holds them, in `model.weights.h5`; `"int8"` (a
                backbone or task): as Keras stores int8 layers, in
                `model.weights.h5` too, about half the size of float16
                weights, loading as a float model (see
                `keras_transformer.presets.int8`).

        Example:

        ```python
        model = TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de")
        model.save_to_preset("en-de", metadata={"note": "a copy"})
        model.save_to_preset("en-de-int8", weights_storage="int8")  # under half the size
        TransformerSeq2SeqLM.from_preset("en-de-int8")  # a float32 model again
        ```
        """
        int8.check_storage(weights_storage)
        backbone = getattr(self, "backbone", self)
        if isinstance(backbone, keras_hub.models.Backbone):  # it writes metadata.json
            metadata = {"tasks": _task_names(type(backbone)), **(metadata or {})}
            metadata.pop(STORAGE_KEY, None)  # (copied from another preset's metadata)
            if weights_storage == "int8":
                int8.check_storable(backbone)
                metadata[STORAGE_KEY] = "int8"
        elif weights_storage != "float":
            raise ValueError(
                f"A {type(self).__name__} has no weights to store in {weights_storage}: `weights_storage` "
                "applies to a backbone or a task."
            )
        # A task writes a whole preset. A backbone, tokenizer or
        # preprocessor writes one part beside the others; a new backbone
        # makes an older task's files (which hold its config) wrong.
        if isinstance(self, keras_hub.models.Task):
            replaces = PRESET_ENTRIES
        elif isinstance(self, keras_hub.models.Backbone):
            replaces = (TASK_FILE, TASK_WEIGHTS_FILE, *WEIGHTS_ENTRIES, ENSEMBLE_DIR)
        else:
            replaces = ()
        with saving(preset_dir, metadata, replaces) as directory:
            super().save_to_preset(directory, *args, **kwargs)
            if weights_storage == "int8":
                int8.store_backbone(backbone, directory)


# What keras-hub's loaders take beside the constructor's arguments.
_LOADER_KEYWORDS = ("load_weights", "load_task_weights", "dtype")


def _check_keywords(cls, kwargs):
    """Refuses a keyword that neither the loader nor any constructor of
    `cls` takes: keras-hub passes such a keyword into the config it builds
    from, where it is dropped without a word (a typo of `load_weights`
    would load them)."""
    known = {*_LOADER_KEYWORDS, *getattr(cls, "preset_keywords", ()), *constructor_keywords(cls)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise TypeError(
            f"{cls.__name__}.from_preset() got an unexpected keyword argument {unknown[0]!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "") + "."
        )


def _check_dtype(dtype):
    """`from_preset(dtype=...)`: a float dtype or policy, checked before the
    preset is read (Keras' error would seem to be the preset's)."""
    if dtype is None:
        return
    quantized = isinstance(dtype, str) and dtype.startswith(("int", "float8"))
    try:
        policy = None if quantized else keras.dtype_policies.get(dtype)
    except (TypeError, ValueError):
        policy = None
    if policy is None or isinstance(policy, keras.dtype_policies.QuantizedDTypePolicy):
        raise ValueError(
            f"dtype={dtype!r} is not a dtype to load a model in: use 'float32', 'bfloat16', 'float16' "
            "or a mixed policy ('mixed_bfloat16'). For int8 weights, load the model and call "
            "`model.quantize(\"int8\")`."
        )


def _builds_without_weights(loader, directory, args, kwargs):
    """Whether the preset's config files alone build a model (so that a
    failed load is the weights' fault)."""
    try:
        loader.from_preset(directory, *args, **{**kwargs, "load_weights": False})
    except Exception:  # the config's own error is the one to report
        return False
    return True


def _task_names(backbone_cls):
    # keras-hub lists the tasks of a backbone by each task class's first
    # base, which is `PresetIO` here: name the keras-hub bases instead.
    tasks = {
        task for task in keras.saving.get_custom_objects().values()
        if isinstance(task, type) and issubclass(task, keras_hub.models.Task)
    }
    return sorted({
        base.__name__
        for task in tasks if getattr(task, "backbone_cls", None) is backbone_cls
        for base in task.__bases__ if base is not PresetIO
    })
