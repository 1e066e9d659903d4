"""Other checkpoint formats in and out.

- `keras_transformer.convert.marian`: Marian (opus-mt) checkpoints as
  transformers saves them. `from_preset` of every class of this package loads
  them directly; `convert_marian` writes one as a preset of this package.
- `keras_transformer.convert.m2m100`: fairseq's multilingual M2M100 and
  NLLB-200 checkpoints (`model_type: m2m_100`), read the same way;
  `convert_m2m100` writes one as a preset.
- `export_transformers`: any model of this package as a transformers
  checkpoint directory (for transformers and CTranslate2), in the format
  that holds it: `export_m2m100` for M2M100 and NLLB-200 models,
  `export_marian` for the others.
"""

from keras_transformer.convert.export_m2m100 import export_m2m100
from keras_transformer.convert.export_marian import export_marian
from keras_transformer.convert.export_transformers import export_transformers
from keras_transformer.convert.m2m100 import convert as convert_m2m100
from keras_transformer.convert.m2m100 import is_m2m100
from keras_transformer.convert.marian import convert as convert_marian
from keras_transformer.convert.marian import is_marian

__all__ = [
    "convert_m2m100", "convert_marian", "export_m2m100", "export_marian", "export_transformers", "is_m2m100",
    "is_marian",
]
