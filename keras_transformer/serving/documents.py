"""A request's texts as documents (`keras_transformer.documents`): each
text split into the sentences its model translates, as
`generate(..., split_sentences=True, format=...)` splits it, so that the
sentences of every request are decoded together in the batcher's
batches; the translations are put back in place, paragraphs, whitespace
and HTML markup kept.
"""

from keras_transformer.documents import Document
from keras_transformer.documents.document import assembled
from keras_transformer.documents.document import markup_pairs
from keras_transformer.models.transformer.generation import document_options

__all__ = ["assembled", "markup_pairs", "split_documents"]


def split_documents(route, texts, text_format):
    """`(documents, segments)`: a `Document` for each of `texts` (`"text"`
    or `"html"`), and all their segments in order."""
    options = document_options(route.served.model, route.source_language)
    documents = [Document(text, format=text_format, **options) for text in texts]
    return documents, [segment for document in documents for segment in document.segments]
