from keras_transformer.models.transformer.backbone import TransformerBackbone
from keras_transformer.models.transformer.configs import CONFIGS
from keras_transformer.models.transformer.configs import PAPER_CONFIGS
from keras_transformer.models.transformer.configs import PAPER_TABLE3
from keras_transformer.models.transformer.configs import PAPER_VOCABULARY_SIZE
from keras_transformer.models.transformer.m2m100_tokenizer import M2M100Tokenizer
from keras_transformer.models.transformer.marian_tokenizer import MarianTokenizer
from keras_transformer.models.transformer.seq2seq_lm import TransformerSeq2SeqLM
from keras_transformer.models.transformer.seq2seq_lm_preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.models.transformer.special_tokens import SpecialTokenIds
from keras_transformer.models.transformer.special_tokens import special_token_ids
from keras_transformer.models.transformer.tokenizer import TransformerTokenizer
from keras_transformer.models.transformer.tokenizer import TransformerWordPieceTokenizer
from keras_transformer.models.transformer.tokenizer import train_tokenizer
from keras_transformer.presets import keras_hub_registry
from keras_transformer.utils.keras_hub_internals import register_presets

# The presets shipped inside the package, in keras-hub's registry, so that
# keras-hub resolves their names (with no network) like its own presets.
register_presets(keras_hub_registry(), TransformerBackbone)
