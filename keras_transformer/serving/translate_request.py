"""A `POST /translate` body read and checked, as LibreTranslate takes it.

JSON (`{"q": "..." or ["...", ...], "source": "en", "target": "de",
"format": "text"}`) or a form (`application/x-www-form-urlencoded`, with
the query string's fields). Problems are `ApiError`s naming the field:
400 for a body that is not JSON or a form, a missing `q` or `target`, or
a value the server does not take; 422 for a field of the wrong type; 413
for a request over the server's limits (`Limits`).
"""

import dataclasses
import json
import urllib.parse

from keras_transformer.serving.errors import ApiError
from keras_transformer.serving.registry import AUTO

FORMATS = ("text", "html")
# Formats this server translates: "html" keeps tags and translates text
# nodes and the attributes for readers (`documents.Document`).


@dataclasses.dataclass(frozen=True)
class Limits:
    """The most a request may hold: characters of all its texts, and texts."""

    max_request_chars: int = 20000
    max_sentences: int = 128

    @property
    def max_body_bytes(self):
        """The most bytes a body may take: each character written as a
        JSON escape of a surrogate pair (12 bytes), and room for the rest."""
        return 12 * self.max_request_chars + 65536


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    """A checked request: its `texts`, whether `q` was one string
    (`single`), and its languages and format."""

    texts: list
    single: bool
    source: str
    target: str
    format: str


async def read_body(request, limits):
    """The request's body, refused with 413 once it is over
    `limits.max_body_bytes` (by its Content-Length, or as it arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise ApiError(413, f"Invalid request: the body ({int(declared)} bytes) exceeds the limit of "
                            f"{limits.max_body_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise ApiError(413, f"Invalid request: the body exceeds the limit of {limits.max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def body_fields(body, content_type, query=""):
    """The fields of a body: a JSON object, or a form (with the query
    string's fields under it). Content types other than JSON and forms are
    read as JSON if they parse as JSON."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        raise ApiError(415, "Invalid request: multipart/form-data bodies are not read; send JSON "
                            "(Content-Type: application/json) or application/x-www-form-urlencoded")
    if kind == "application/x-www-form-urlencoded":
        return _form_fields(body, query)
    try:
        fields = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError) as error:
        raise ApiError(400, f"Invalid request: the body is not valid JSON ({error})") from None
    if not isinstance(fields, dict):
        what = "empty" if fields is None else f"a JSON {type(fields).__name__}"
        raise ApiError(400, f"Invalid request: the body is {what}; send a JSON object such as "
                            '{"q": "Hello", "source": "en", "target": "de"}')
    return fields


def _form_fields(body, query):
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(400, f"Invalid request: the form is not UTF-8 ({error})") from None
    fields = {}
    for part in (query, text):
        for name, values in urllib.parse.parse_qs(part, keep_blank_values=True).items():
            fields[name] = values[0] if len(values) == 1 else values
    return fields


def check_request(fields, limits):
    """A `TranslateRequest` of a body's fields, or the `ApiError` that
    names what is wrong."""
    q = fields.get("q")
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter")
    single = isinstance(q, str)
    if not single and not (isinstance(q, list) and all(isinstance(text, str) for text in q)):
        wrong = q if not isinstance(q, list) else next(text for text in q if not isinstance(text, str))
        raise ApiError(422, f"Invalid request: q must be a string or a list of strings, got "
                            f"{'a list holding ' if isinstance(q, list) else ''}{_json_type(wrong)}")
    texts = [q] if single else list(q)
    source, target, text_format = (_string_field(fields, name) for name in ("source", "target", "format"))
    if not target:
        raise ApiError(400, "Invalid request: missing target parameter")
    text_format = text_format or "text"
    if text_format not in FORMATS:
        raise ApiError(400, f"Invalid request: {text_format!r} format is not supported (text or html)")
    if len(texts) > limits.max_sentences:
        raise ApiError(413, f"Invalid request: the request holds {len(texts)} texts, over the limit of "
                            f"{limits.max_sentences} texts a request")
    chars = sum(map(len, texts))
    if chars > limits.max_request_chars:
        raise ApiError(413, f"Invalid request: the request holds {chars} characters, over the limit of "
                            f"{limits.max_request_chars} characters a request")
    if not source or source.lower() == AUTO:
        source = AUTO
    return TranslateRequest(texts, single, source, target, text_format)


def _string_field(fields, name):
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(422, f"Invalid request: {name} must be a string, got {_json_type(value)}")
    return value.strip() if value else value


def _json_type(value):
    names = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "a list",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)
