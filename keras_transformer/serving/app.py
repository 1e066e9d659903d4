"""The server's routes, LibreTranslate's API on FastAPI.

- `POST /translate`: `{"q": str | [str], "source": "en" | "auto", "target":
  "de", "format": "text" | "html"}` -> `{"translatedText": str | [str]}` (a
  list for a list), `{"error": ...}` with 400, 413, 415 or 422 for a bad
  request. Each text is a document: split into sentences (`documents.py`),
  its paragraphs, whitespace and HTML markup kept.
- `GET /languages`: `[{"code": "en", "name": "English", "targets": ["de"]}]`.
- `GET /health`, `GET /metrics` (`metrics.py`), and the page at `GET /`
  (`page.html`).

The translate route is `translate_route.py`'s: each request's sentences
go to the `Batcher`, which decodes them with those of other requests; the
route waits for them, or for its client to leave (then its sentences
leave the queue).
"""

import asyncio
import contextlib

from keras_transformer.serving.errors import install_error_handlers
from keras_transformer.serving.page import page_html
from keras_transformer.serving.translate_request import Limits
from keras_transformer.serving.translate_route import TranslateFastPath
from keras_transformer.serving.translate_route import translate_handler

# As LibreTranslate: pages of other origins may call the API.
CORS = {"allow_origins": ["*"], "allow_methods": ["GET", "POST"], "allow_headers": ["*"]}


def health_answer(registry, batcher, metrics):
    """`GET /health`'s status and answer: 200 while every worker process
    decodes (its decoding thread runs), else 503 naming how many stopped.

    Example, a server of one process:

    >>> from types import SimpleNamespace
    >>> from keras_transformer.serving.metrics import Metrics
    >>> registry = SimpleNamespace(served=[SimpleNamespace(name="m")], pairs=["en-de"])
    >>> health_answer(registry, SimpleNamespace(alive=True), Metrics())
    (200, {'status': 'ok', 'models': ['m'], 'pairs': ['en-de'], 'workers': 1})
    >>> health_answer(registry, SimpleNamespace(alive=False), Metrics())
    (503, {'status': 'error', 'error': 'the decoding thread stopped'})
    """
    workers = metrics.slots.slots
    stopped = set(metrics.stopped_workers()) | ({metrics.slots.slot} if not batcher.alive else set())
    if stopped:
        where = f" in {len(stopped)} of {workers} worker processes" if workers > 1 else ""
        return 503, {"status": "error", "error": f"the decoding thread stopped{where}"}
    models = [served.name for served in registry.served]
    return 200, {"status": "ok", "models": models, "pairs": registry.pairs, "workers": workers}


def create_app(registry, batcher, metrics, limits=Limits()):
    """The ASGI application serving `registry`'s models through `batcher`
    (FastAPI's, with `POST /translate` on its fast path and CORS headers
    on every answer); its shutdown lets `batcher` decode what is queued
    first.

    Args:
        registry: a `registry.Registry` (which model serves which pair).
        batcher: a started `batcher.Batcher`.
        metrics: the `metrics.Metrics` that `batcher` reports to.
        limits: a `translate_request.Limits`.
    """
    from fastapi import FastAPI
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import HTMLResponse
    from fastapi.responses import JSONResponse

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # Uvicorn has answered the requests in flight: the queue is empty
        # unless a client left; what is left is decoded, then the thread ends.
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)

    app = FastAPI(title="keras-transformer serve", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    install_error_handlers(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(page_html())

    @app.get("/languages")
    async def languages():
        return registry.languages()

    @app.get("/health")
    async def health():
        status, answer = health_answer(registry, batcher, metrics)
        return JSONResponse(answer, status_code=status)

    @app.get("/metrics")
    async def metrics_route():
        return metrics.snapshot(queued=batcher.queued())

    translate = translate_handler(registry, batcher, metrics, limits)
    # (Registered for the API's schema at /docs; uvicorn calls it through
    # `TranslateFastPath`, which `create_app` returns.)
    app.post("/translate")(translate)
    return CORSMiddleware(TranslateFastPath(app, translate), **CORS)
