"""Presets: models saved by name or directory, and the ones this package ships.

A preset is a directory as keras-hub writes it (`config.json`,
`model.weights.h5`, `task.json`, `preprocessor.json`, `tokenizer.json`,
`assets/tokenizer/vocabulary.spm`, `metadata.json`). Every `from_preset` of
this package takes:

- the name of a preset shipped inside the package (no network needed):
  `TransformerSeq2SeqLM.from_preset("transformer_multi30k_en_de")`;
- a local directory written by `save_to_preset`;
- any handle keras-hub understands: `kaggle://owner/model/keras/variant`,
  `hf://owner/model`, `gs://...` (upload one with `upload_preset`);
- a Marian (opus-mt) checkpoint as transformers saves it, in a directory or
  as an `hf://` handle such as `hf://Helsinki-NLP/opus-mt-en-de`, converted
  on loading (`keras_transformer.convert.marian`).

`list_presets()` returns the shipped presets with their description, size and
scores; `keras-transformer presets` prints them.

`save_to_preset(..., weights_storage="int8")` and `store_int8` store a
preset's weights in int8 (as Keras stores int8 layers, in
`model.weights.h5`: about half the size of float16 weights); such a preset
loads as a float model (`keras_transformer.presets.int8`).

`upload_preset(handle, preset)` (`keras-transformer upload`) shares a preset
on Kaggle or the Hugging Face hub with keras-hub's `upload_preset`, after
its checks on every model of the preset (`keras_transformer.presets.sharing`).

The presets sit below the models, as data: this package reads, checks and
saves preset directories (an unknown name lists the shipped ones; a missing
or corrupt file is named; a save that fails halfway leaves the directory as
it was), and names neither the models nor the converters above it. What it
needs of them, the package lists in `keras_transformer/__init__.py`,
imported on first use: the modules of the classes that a preset's config
names (`presets/classes.py`), and those of other libraries' checkpoint
formats, which register their loaders (`presets/formats.py`). The models'
`from_preset` and `save_to_preset` build on it
(`keras_transformer.models.preset_io`).
"""

from keras_transformer.presets import int8
from keras_transformer.presets.checks import check
from keras_transformer.presets.checks import check_loaded
from keras_transformer.presets.int8_conversion import store_int8
from keras_transformer.presets.layout import ASSETS_DIR
from keras_transformer.presets.layout import CHECKSUMS_KEY
from keras_transformer.presets.layout import CONFIG_FILE
from keras_transformer.presets.layout import ENSEMBLE_DIR
from keras_transformer.presets.layout import INT8_WEIGHTS_FILE
from keras_transformer.presets.layout import METADATA_FILE
from keras_transformer.presets.layout import PREPROCESSOR_FILE
from keras_transformer.presets.layout import PRESETS_DIR
from keras_transformer.presets.layout import PRESET_ENTRIES
from keras_transformer.presets.layout import SHARDED_WEIGHTS_FILES
from keras_transformer.presets.layout import SHARDED_WEIGHTS_INDEX
from keras_transformer.presets.layout import STORAGE_KEY
from keras_transformer.presets.layout import TASK_FILE
from keras_transformer.presets.layout import TASK_WEIGHTS_FILE
from keras_transformer.presets.layout import TOKENIZER_FILE
from keras_transformer.presets.layout import WEIGHTS_ENTRIES
from keras_transformer.presets.layout import WEIGHTS_FILE
from keras_transformer.presets.layout import PresetError
from keras_transformer.presets.layout import weights_do_not_fit
from keras_transformer.presets.registry import keras_hub_registry
from keras_transformer.presets.registry import list_presets
from keras_transformer.presets.registry import preset_metadata
from keras_transformer.presets.registry import read_json_object
from keras_transformer.presets.registry import read_metadata
from keras_transformer.presets.registry import read_preset_file
from keras_transformer.presets.registry import resolve
from keras_transformer.presets.saving import saving
from keras_transformer.presets.sharing import upload_preset
