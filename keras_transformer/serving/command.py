"""`keras-transformer serve`: the presets loaded, then LibreTranslate's
API and a page on uvicorn, until Ctrl-C or SIGTERM.

    keras-transformer serve
    keras-transformer serve --preset transformer_multi30k_en_de --preset transformer_multi30k_de_en
    keras-transformer serve --preset runs/en-fr/model=en-fr --host 0.0.0.0 --port 8080

FastAPI and uvicorn come with `pip install "keras-aiayn[serve]"`; the
command says so where they are missing. This module imports neither until
the command runs (the command line builds its parser on every start).
"""

import asyncio
import logging
import signal
import sys

from keras_transformer.serving import batcher as batching
from keras_transformer.serving.translate_request import Limits
from keras_transformer.utils import arguments

logger = logging.getLogger("uvicorn.error")

DEFAULT_PRESET = "transformer_multi30k_en_de"
DESCRIPTION = (
    "Serve translations over HTTP with LibreTranslate's API (POST /translate, GET /languages), "
    "GET /health, GET /metrics and a page at / (no external assets: works offline). Requests that "
    "arrive together are decoded together (dynamic batching): one thread runs the models, taking "
    "the queued sentences of a language pair up to --max-batch-tokens, after waiting at most "
    "--batch-wait-ms for more. SIGTERM or Ctrl-C answers the requests in flight, then exits. "
    "Needs FastAPI and uvicorn: pip install \"keras-aiayn[serve]\"."
)
port_number = arguments.bounded(int, lambda value: 0 <= value <= 65535, "a port number in [0, 65535]")


def add_arguments(p):
    """The `serve` command's options."""
    from keras_transformer import cli_formats

    p.add_argument("--preset", action="append", metavar="NAME_OR_DIR[=SRC-TGT]",
                   help="a preset to serve (name, directory or handle); repeat for several, each serving "
                   "its language pair (from its metadata.json, or SRC-TGT after '=': runs/x/model=en-fr) or, "
                   "for a multilingual model, every pair of its languages; a pair served by several goes "
                   f"to the first (default: {DEFAULT_PRESET})")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on; 0.0.0.0 for every interface (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=5000,
                   help="the port to listen on; 0 for a free one, named in the startup line (default: 5000)")
    p.add_argument("--beam-size", type=arguments.positive_int, default=4, help="1 decodes greedily (default: 4)")
    p.add_argument("--alpha", type=arguments.non_negative_float, default=0.6, help="length penalty (default: 0.6)")
    p.add_argument("--length-penalty", choices=("gnmt", "length"), default="gnmt",
                   help="gnmt: ((5 + |Y|) / 6) ** alpha, the paper's; length: |Y| ** alpha (default: gnmt)")
    cli_formats.add_precision(p)
    p.add_argument("--first-model-only", action="store_true", help="of an ensemble preset, decode with its first "
                   "model alone (faster; the shipped presets are ensembles)")
    p.add_argument("--max-batch-tokens", type=arguments.bounded(int, lambda v: 1 <= v <= 1 << 20, "in [1, 2**20]"),
                   default=batching.DEFAULT_MAX_BATCH_TOKENS,
                   help="decode at most this many source tokens together: sentences x the longest one's "
                   "tokens, estimated as one a 4 bytes; a longer sentence goes alone "
                   f"(default: {batching.DEFAULT_MAX_BATCH_TOKENS})")
    p.add_argument("--batch-wait-ms", type=arguments.non_negative_float,
                   default=batching.DEFAULT_BATCH_WAIT_SECONDS * 1000,
                   help="how long a sentence waits for others to decode with it, when the model is free "
                   f"(default: {batching.DEFAULT_BATCH_WAIT_SECONDS * 1000:g})")
    p.add_argument("--workers", type=arguments.positive_int, default=1,
                   help="serve from this many processes, each with its own copy of the models, decoding thread and "
                   "event loop, on one address (one decodes while another answers and reads requests; each "
                   "computes with its share of the cores); GET /metrics adds up all of them (default: 1)")
    p.add_argument("--max-request-chars", type=arguments.positive_int, default=Limits.max_request_chars,
                   help="refuse (413) a request whose texts hold more characters than this "
                   f"(default: {Limits.max_request_chars})")
    p.add_argument("--max-sentences", type=arguments.positive_int, default=Limits.max_sentences,
                   help=f"refuse (413) a request of more texts than this (default: {Limits.max_sentences})")
    p.add_argument("--no-access-log", action="store_true", help="log no line for each request")


def preset_names(args):
    """The presets of `--preset` by name, without their `=SRC-TGT`."""
    from keras_transformer.serving.registry import parse_preset_argument

    return [parse_preset_argument(value)[0] for value in args.preset or [DEFAULT_PRESET]]


def require_packages():
    """Imports FastAPI and uvicorn, or exits naming the extra to install."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"error: keras-transformer serve needs FastAPI and uvicorn ({error}): "
            'pip install "keras-aiayn[serve]"'
        ) from None


def serve(args):
    """Runs the `serve` command in this process: loads the presets (in the
    decoding thread), then serves until Ctrl-C or SIGTERM, answering the
    requests in flight. (`--workers N` runs `workers.run` instead.)"""
    require_packages()
    from keras_transformer.serving.metrics import Metrics

    serve_here(args, Metrics())


def serve_here(args, metrics, sockets=None, ready=None, channel=None):
    """Serves in this process: the presets loaded in its decoding thread,
    counting into `metrics`, on `sockets` (by default `--host` and
    `--port`), or on the connections that arrive on `channel` (a worker's
    end of its socket pair: `connections.receive`); `ready(registry)` once
    it serves (by default, the line that names the address is logged)."""
    import uvicorn

    from keras_transformer.serving.app import create_app
    from keras_transformer.serving.connections import counted_protocol

    batcher = batching.Batcher(metrics, max_batch_tokens=args.max_batch_tokens, batch_wait=args.batch_wait_ms / 1000)
    registry = batcher.start(load=lambda: load_registry(args))
    limits = Limits(max_request_chars=args.max_request_chars, max_sentences=args.max_sentences)
    app = create_app(registry, batcher, metrics, limits)
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=not args.no_access_log,
                            lifespan="on", log_level="info", http=counted_protocol(metrics))
    server = _uvicorn_server(config, registry, ready, channel)
    # Uvicorn raises the signal that stopped it again once it has shut down,
    # with the handlers it found: a shutdown it finished ends with status 0.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda *_: None)
    try:
        server.run(sockets=[] if channel is not None else sockets)
    finally:
        batcher.close()


def load_registry(args):
    """The presets of `args` loaded as a `Registry`, each decoded once
    (compiled where the backend compiles), in the thread that decodes."""
    from keras_transformer import presets
    from keras_transformer.models import TransformerSeq2SeqLM
    from keras_transformer.serving.language_detection import load_detector
    from keras_transformer.serving.registry import Registry
    from keras_transformer.serving.registry import ServedModel
    from keras_transformer.serving.registry import metadata_pair
    from keras_transformer.serving.registry import parse_preset_argument
    from keras_transformer.utils.compile_cache import use_compile_cache

    use_compile_cache()
    options = {"dtype": args.dtype} if args.dtype else {}
    if args.first_model_only:
        options["load_ensemble"] = False
    served = []
    for value in args.preset or [DEFAULT_PRESET]:
        name, pair = parse_preset_argument(value)
        print(f"Loading {name}", file=sys.stderr, flush=True)
        model = TransformerSeq2SeqLM.from_preset(name, **options)
        for member in (model, *model.ensemble_members) if args.quantize else ():
            member.quantize(args.quantize)
        pair = pair or metadata_pair(presets.preset_metadata(name))
        served.append(ServedModel(name, model, decoding_settings(args), pair))
    registry = Registry(served)
    if registry.needs_detection():  # (source "auto" into a target served from several sources)
        registry.detector = load_detector()
    for route in registry.first_routes():
        route.generate(["A warm-up."])
    return registry


def decoding_settings(args):
    """`generate`'s keywords of the command's decoding options."""
    if args.beam_size == 1:
        return {"sampler": "greedy"}
    return {"beam_size": args.beam_size, "alpha": args.alpha, "length_penalty": args.length_penalty}


def _uvicorn_server(config, registry, ready=None, channel=None):
    """Uvicorn's server, which also logs the page's URL (with the port
    chosen for `--port 0`) once it listens, or calls `ready(registry)`;
    with a `channel`, it also serves the connections that arrive on it."""
    import uvicorn

    from keras_transformer.serving.connections import receive

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if channel is not None and not self.should_exit:
                # (as uvicorn makes the protocol of each connection it accepts)
                receive(channel, asyncio.get_running_loop(), lambda: config.http_protocol_class(
                    config=config, server_state=self.server_state, app_state=self.lifespan.state))
            if ready is not None:
                ready(registry)
            elif getattr(self, "servers", None):
                log_address(registry.pairs, self.servers[0].sockets[0])

    return Server(config)


def log_address(pairs, sock, workers=1):
    """The line that names the served pairs and the address (with the port
    chosen for `--port 0`)."""
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    logger.info("Serving %s at http://%s:%d/ (the page; the API: POST /translate, GET /languages)%s",
                ", ".join(pairs), host, port, f" in {workers} worker processes" if workers > 1 else "")
