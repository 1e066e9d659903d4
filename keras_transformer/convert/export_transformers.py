"""Any model of this package as a transformers checkpoint directory, in
the format that holds it: `m2m_100` for M2M100 and NLLB-200 models
(`export_m2m100`), Marian for the others (`export_marian`).

    keras-transformer export-transformers nllb-en-fr --preset nllb-200-600M-en-fr
    keras-transformer export-transformers marian-en-de --preset transformer_multi30k_en_de
"""

from keras_transformer.convert.checkpoint_directory import load_task
from keras_transformer.convert.export_m2m100 import export_m2m100
from keras_transformer.convert.export_m2m100 import is_m2m100_model
from keras_transformer.convert.export_marian import export_marian


def export_transformers(model, output_dir, overwrite=False):
    """Writes `model` as a transformers checkpoint directory that
    transformers (`AutoModelForSeq2SeqLM`, `AutoTokenizer`) and
    CTranslate2's `ct2-transformers-converter` load: an `m2m_100` one for
    a model of the M2M100 / NLLB-200 family, else a Marian one.

    Args:
        model: a `TransformerSeq2SeqLM` with a preprocessor, or the name,
            directory or handle of a preset.
        output_dir: the directory to write; it must be empty or absent
            unless `overwrite`.
        overwrite: replace the files of an earlier export in `output_dir`.

    Returns:
        `(output_dir, model_type)`: the directory and the format written
        (`"m2m_100"` or `"marian"`).

    Example:

    ```python
    from keras_transformer.convert import export_transformers
    export_transformers("transformer_multi30k_en_de", "marian-en-de")  # (..., "marian")
    ```
    """
    model = load_task(model, "export_transformers")
    if is_m2m100_model(model):
        return export_m2m100(model, output_dir, overwrite=overwrite), "m2m_100"
    return export_marian(model, output_dir, overwrite=overwrite), "marian"
