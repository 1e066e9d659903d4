"""Whole documents: a text or an HTML page split into the sentences a
model translates, and put back together from their translations.

`sentences.py` finds sentences (sentencex) and splits one that is too
long for a model at a sensible boundary; `markup.py` reads HTML into
markup to keep and text to translate; `document.py` holds the plan,
`Document`. `TransformerSeq2SeqLM.generate(..., split_sentences=True)`
and `keras-transformer translate --split-sentences` translate documents
through it.

Example:

>>> from keras_transformer.documents import Document
>>> document = Document("Dr. Smith arrived. He was late!\\n\\nThe end.")
>>> document.segments
['Dr. Smith arrived.', 'He was late!', 'The end.']
>>> document.assemble(["Dr. Smith kam an.", "Er war spät dran!", "Das Ende."])
'Dr. Smith kam an. Er war spät dran!\\n\\nDas Ende.'
"""

from keras_transformer.documents.document import Document

__all__ = ["Document"]
