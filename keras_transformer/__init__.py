"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Runs the same code on JAX, TensorFlow and PyTorch. Modules follow the paper:
`layers` (sections 3.1-3.5), `models` (section 3 and Table 3), `data` and
`datasets` (section 5.1), `schedules` (section 5.3), `losses` (section 5.4),
`decoding`, `callbacks` and `metrics` (section 6.1). `presets` lists the
pretrained models shipped with the package; `export` writes a TensorFlow
SavedModel that translates strings.
"""

from keras_transformer import callbacks
from keras_transformer import data
from keras_transformer import datasets
from keras_transformer import decoding
from keras_transformer import layers
from keras_transformer import losses
from keras_transformer import metrics
from keras_transformer import models
from keras_transformer import presets
from keras_transformer import schedules
from keras_transformer.version import __version__
