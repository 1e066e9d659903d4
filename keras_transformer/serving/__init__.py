"""Translations over HTTP: `keras-transformer serve`.

LibreTranslate's API (`POST /translate`, `GET /languages`), with
`GET /health`, `GET /metrics` and a page at `/`, on FastAPI and uvicorn
(`pip install "keras-aiayn[serve]"`). One module an idea: `command.py`
the command (options, loading, uvicorn), `app.py` the routes,
`translate_request.py` a request's body read and checked, `errors.py` the
JSON errors, `registry.py` which model serves which language pair,
`batcher.py` dynamic batching in the one thread that decodes,
`metrics.py` the counters, `workers.py` several worker processes
(`--workers`), `page.py` and `page.html` the page.

Importing this package imports neither FastAPI nor a model.
"""
