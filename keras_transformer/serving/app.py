"""The server's routes, LibreTranslate's API on FastAPI.

- `POST /translate`: `{"q": str | [str], "source": "en" | "auto", "target":
  "de", "format": "text" | "html"}` -> `{"translatedText": str | [str]}` (a
  list for a list), `{"error": ...}` with 400, 413, 415 or 422 for a bad
  request. Each text is a document: split into sentences (`documents.py`),
  its paragraphs, whitespace and HTML markup kept.
- `GET /languages`: `[{"code": "en", "name": "English", "targets": ["de"]}]`.
- `GET /health`, `GET /metrics` (`metrics.py`), and the page at `GET /`
  (`page.html`).

Each request's sentences go to the `Batcher`, which decodes them with
those of other requests; the route waits for them, or for its client to
leave (then its sentences leave the queue).
"""

import asyncio
import contextlib
import logging
import time

from keras_transformer.serving.batcher import Job
from keras_transformer.serving.documents import assembled
from keras_transformer.serving.documents import split_documents
from keras_transformer.serving.errors import ApiError
from keras_transformer.serving.errors import install_error_handlers
from keras_transformer.serving.page import page_html
from keras_transformer.serving.registry import UnknownPair
from keras_transformer.serving.translate_request import Limits
from keras_transformer.serving.translate_request import body_fields
from keras_transformer.serving.translate_request import check_request
from keras_transformer.serving.translate_request import read_body

logger = logging.getLogger("keras_transformer.serving")


def create_app(registry, batcher, metrics, limits=Limits()):
    """The FastAPI application serving `registry`'s models through
    `batcher`; its shutdown lets `batcher` decode what is queued first.

    Args:
        registry: a `registry.Registry` (which model serves which pair).
        batcher: a started `batcher.Batcher`.
        metrics: the `metrics.Metrics` that `batcher` reports to.
        limits: a `translate_request.Limits`.
    """
    from fastapi import FastAPI
    from fastapi import Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import HTMLResponse
    from fastapi.responses import JSONResponse
    from starlette.requests import ClientDisconnect

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # Uvicorn has answered the requests in flight: the queue is empty
        # unless a client left; what is left is decoded, then the thread ends.
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)

    app = FastAPI(title="keras-transformer serve", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    # As LibreTranslate: pages of other origins may call the API.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"], allow_headers=["*"])
    install_error_handlers(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(page_html())

    @app.get("/languages")
    async def languages():
        return registry.languages()

    @app.get("/health")
    async def health():
        if not batcher.alive:
            return JSONResponse({"status": "error", "error": "the decoding thread stopped"}, status_code=503)
        return {"status": "ok", "models": [served.name for served in registry.served], "pairs": registry.pairs}

    @app.get("/metrics")
    async def metrics_route():
        return metrics.snapshot(queued=batcher.queued())

    @app.post("/translate")
    async def translate(request: Request):
        started = time.monotonic()
        try:
            body = await read_body(request, limits)
            fields = body_fields(body, request.headers.get("content-type"), request.url.query)
            checked = check_request(fields, limits)
            route = registry.route(checked.source, checked.target)
        except ClientDisconnect:  # gone before its body arrived
            metrics.disconnected(started=False)
            return JSONResponse({"error": "client closed the request"}, status_code=499)
        except UnknownPair as error:
            metrics.request_finished(400, time.monotonic() - started, started=False)
            raise ApiError(400, str(error)) from None
        except ApiError as error:
            metrics.request_finished(error.status, time.monotonic() - started, started=False)
            raise
        try:  # (off the event loop: a long request's tokenization takes a while)
            documents, segments = await asyncio.get_running_loop().run_in_executor(
                None, split_documents, route, checked.texts, checked.format)
        except ValueError as error:
            metrics.request_finished(400, time.monotonic() - started, started=False)
            raise ApiError(400, f"Cannot translate text: {error}") from None
        translations = []
        if segments:  # (texts of whitespace or markup only: nothing to decode)
            translations = await _translations(request, batcher, metrics, route, segments, started)
        if translations is None:  # the client left: nobody reads this
            return JSONResponse({"error": "client closed the request"}, status_code=499)
        translations = assembled(documents, translations)
        answer = {"translatedText": translations[0] if checked.single else translations}
        if checked.source == "auto":
            # Not detected: the one source this server translates into the target.
            detected = {"confidence": 100.0, "language": route.pair[0]}
            answer["detectedLanguage"] = detected if checked.single else [detected] * len(translations)
        return answer

    return app


async def _translations(request, batcher, metrics, route, texts, started):
    """The translations of `texts`, decoded by `batcher` with other
    requests' sentences; None if the client left first."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def deliver(outcome):  # called by the decoding thread
        loop.call_soon_threadsafe(_settle, future, outcome)

    job = Job(route, texts, deliver)
    try:
        batcher.submit(job)
    except RuntimeError as error:
        metrics.request_finished(503, time.monotonic() - started, started=False)
        raise ApiError(503, f"Cannot translate text: {error}") from None
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
