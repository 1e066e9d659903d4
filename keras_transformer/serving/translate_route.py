"""`POST /translate`: a request read and checked, its documents split into
sentences, the sentences decoded by the `Batcher` with those of other
requests, the documents put back together.

`translate_handler` makes the handler (a coroutine of a Starlette
`Request`: the answer's dict, or a `JSONResponse`; `ApiError` for a bad
request). `TranslateFastPath` calls it without FastAPI's routing,
dependency solving, middleware and serialization: the busy path of a
server, whose event loop answers a batch's requests and reads the next
ones while the decoding thread waits. FastAPI still routes the rest and
documents this route at /docs.
"""

import asyncio
import logging
import time

from keras_transformer.serving.batcher import Job
from keras_transformer.serving.documents import assembled
from keras_transformer.serving.documents import markup_pairs
from keras_transformer.serving.documents import split_documents
from keras_transformer.serving.errors import ApiError
from keras_transformer.serving.errors import error_response
from keras_transformer.serving.errors import internal_error
from keras_transformer.serving.language_detection import detection_text
from keras_transformer.serving.registry import AUTO
from keras_transformer.serving.registry import UnknownPair
from keras_transformer.serving.translate_request import body_fields
from keras_transformer.serving.translate_request import check_request
from keras_transformer.serving.translate_request import read_body

logger = logging.getLogger("keras_transformer.serving")

# A request of at most this many characters is read (its HTML, for language
# detection) and split into sentences on the event loop (about 0.3 ms for
# 1,000 characters); a longer one in a worker thread. The hop to a worker
# costs more than a short request's split, and the worker's thread contends
# with the decoding thread.
INLINE_SPLIT_CHARS = 1000


def translate_handler(registry, batcher, metrics, limits):
    """The route's handler: `await handler(request)` is the answer (a dict,
    or a `JSONResponse` for a client that left), or raises `ApiError`."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.requests import ClientDisconnect

    async def translate(request: Request):
        started = time.monotonic()
        try:
            body = await read_body(request, limits)
            fields = body_fields(body, request.headers.get("content-type"), request.url.query)
            checked = check_request(fields, limits)
            source = checked.source
            if source == AUTO:
                source, confidence = registry.detect_source(checked.target,
                                                            await _by_size(checked, detection_text, checked))
            route = registry.route(source, checked.target)
        except ClientDisconnect:  # gone before its body arrived
            metrics.disconnected(started=False)
            return JSONResponse({"error": "client closed the request"}, status_code=499)
        except UnknownPair as error:
            metrics.request_finished(400, time.monotonic() - started, started=False)
            raise ApiError(400, str(error)) from None
        except ApiError as error:
            metrics.request_finished(error.status, time.monotonic() - started, started=False)
            raise
        try:
            documents, segments = await _by_size(checked, split_documents, route, checked.texts, checked.format)
        except ValueError as error:
            metrics.request_finished(400, time.monotonic() - started, started=False)
            raise ApiError(400, f"Cannot translate text: {error}") from None
        translations = await _documents_translated(request, batcher, metrics, route, documents, segments, started)
        if translations is None:  # the client left: nobody reads this
            return JSONResponse({"error": "client closed the request"}, status_code=499)
        answer = {"translatedText": translations[0] if checked.single else translations}
        if checked.source == AUTO:  # as LibreTranslate names a detected language
            detected = {"confidence": confidence, "language": route.pair[0]}
            answer["detectedLanguage"] = detected if checked.single else [detected] * len(translations)
        return answer

    return translate


class TranslateFastPath:
    """An ASGI application that calls `translate` for `POST /translate`
    and hands everything else (other routes, other methods, lifespan) to
    `app`.

    Its answers are those of `app`'s route: the handler's dict as JSON,
    `ApiError` as `{"error": ...}` with its status, anything unexpected as
    a logged 500. Wrap it in the CORS middleware that `app`'s routes have,
    so that both kinds of answer carry the same headers.

    On 2 cores, with a model that answers at once and 32 clients, about
    1.3x the requests a second of FastAPI's route.
    """

    def __init__(self, app, translate):
        from starlette import requests
        from starlette import responses

        self.app = app
        self.translate = translate
        self._request, self._responses = requests.Request, responses

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/translate":
            await self.app(scope, receive, send)
            return
        try:
            answer = await self.translate(self._request(scope, receive))
            responses = self._responses
            response = answer if isinstance(answer, responses.Response) else responses.JSONResponse(answer)
        except ApiError as error:
            response = error_response(error.status, error.message)
        except Exception as error:  # noqa: BLE001 - answered as FastAPI's handler answers it
            response = internal_error(scope["method"], scope["path"], error)
        await response(scope, receive, send)


async def _by_size(checked, function, *args):
    """`function(*args)`, work on a checked request's texts (reading HTML,
    splitting into sentences): on the event loop for a short request, in a
    worker thread for a longer one."""
    if sum(map(len, checked.texts)) <= INLINE_SPLIT_CHARS:
        return function(*args)
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


async def _documents_translated(request, batcher, metrics, route, documents, segments, started):
    """`documents` translated (their `segments` decoded by `batcher`,
    then, where inline HTML elements cut sentences, the sentences aligned
    with their translations, on the decoding thread too); None if the
    client left first."""
    if not segments:  # (texts of whitespace or markup only: nothing to decode)
        return assembled(documents, [])
    marked = any(document.markup_segments for document in documents)
    translations = await _translations(request, batcher, metrics, route, segments, started, closes=not marked)
    alignments = None
    if translations is not None and marked:
        pairs = list(zip(*markup_pairs(documents, translations)))
        alignments = await _translations(request, batcher, metrics, route.aligner, pairs, started, opens=False)
        if alignments is None:
            return None
    return None if translations is None else assembled(documents, translations, alignments)


async def _translations(request, batcher, metrics, route, texts, started, opens=True, closes=True):
    """The translations of `texts`, decoded by `batcher` with other
    requests' sentences; None if the client left first. A request that
    goes to the batcher twice (translations, then their word alignments:
    `route.aligner`) is counted from the first (`opens`) to the last
    (`closes`)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(outcome):  # called by the decoding thread
        loop.call_soon_threadsafe(_settle, future, outcome)

    client = request.scope.get("client")  # (host, port): its connection, kept alive by most clients
    job = Job(route, texts, deliver, client=tuple(client) if client else None)
    try:
        batcher.submit(job)
    except RuntimeError as error:
        metrics.request_finished(503, time.monotonic() - started, started=not opens)
        raise ApiError(503, f"Cannot translate text: {error}") from None
    if opens:
        metrics.request_started(len(texts))
    watcher = asyncio.ensure_future(_client_leaves(request))
    try:
        await asyncio.wait({future, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not future.done():  # the client left, or this request was cancelled
            batcher.cancel(job)
            metrics.disconnected()
    if not future.done():
        return None
    outcome = future.result()
    if isinstance(outcome, BaseException):
        status = 400 if isinstance(outcome, (ValueError, TypeError)) else 500
        if status == 500:
            logger.error("translation failed", exc_info=outcome)
        metrics.request_finished(status, time.monotonic() - started)
        raise ApiError(status, f"Cannot translate text: {outcome}")
    if closes:
        metrics.request_finished(200, time.monotonic() - started)
    return outcome


def _settle(future, outcome):
    if not future.done():
        future.set_result(outcome)


async def _client_leaves(request):
    """Returns once the client has closed its connection (the body is read:
    what the server receives next is the disconnect)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return
