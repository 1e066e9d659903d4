"""Presets given as hub handles (`hf://owner/model`,
`kaggle://owner/model/keras/variant[/version]`): when the hub cannot be
reached, an error within seconds that says what to do.

Reading a handle downloads its files into the hub client's cache. Without a
network, huggingface_hub retries each request for about 30 seconds, and
kagglehub's error names a URL and nothing to do. So before a handle is read,
`reading` checks once per process, within `PROBE_SECONDS`, that the hub (or
the proxy that the environment names for it) takes a connection:

- `hf://`: if not, huggingface_hub goes offline for the process (as
  `HF_HUB_OFFLINE=1` does, which also skips the check): a model in its cache
  loads at once, another fails at once.
- `kaggle://`: if not, a handle without a version fails at once (finding the
  latest version needs the hub); one with a version may be in kagglehub's
  cache, which it reads without the network.

A failure to reach the hub while the files are read becomes a `PresetError`
that names the handle, the cause, and how to use the model without a
network: download it once elsewhere and pass its directory.
"""

import contextlib
import os
import socket
import sys
import threading
import urllib.parse
import urllib.request

from keras_transformer.presets.layout import PresetError

PROBE_SECONDS = 3.0
# Where each hub's client connects (kagglesdk: its production endpoint).
ENDPOINTS = {"hf": "https://huggingface.co", "kaggle": "https://api.kaggle.com"}
HUB_NAMES = {"hf": "the Hugging Face hub", "kaggle": "Kaggle"}
DOWNLOAD_COMMANDS = {
    "hf": "`huggingface-cli download {repo} --local-dir DIR`",
    "kaggle": "`kagglehub.model_download('{repo}')`, which prints the directory DIR",
}
# Errors that say the hub was not reached (by class name, in an error's
# causes: the clients wrap them in their own).
_NETWORK_ERRORS = {
    "ConnectionError", "ConnectError", "ConnectTimeout", "TimeoutError", "gaierror", "NameResolutionError",
    "NewConnectionError", "MaxRetryError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
}

_probed = {}  # scheme -> None (reached) or what went wrong


def offline_help(handle):
    """What to do without a network, for `handle`."""
    scheme, repo = _split(handle)
    command = DOWNLOAD_COMMANDS.get(scheme, "the hub's client").format(repo=repo)
    return (
        f"Without network access, download the model once on a machine that has it ({command}), copy DIR "
        "here and pass the directory: `from_preset(DIR)`, `keras-transformer translate --preset DIR`."
    )


@contextlib.contextmanager
def reading(handle):
    """Around the reading of the hub handle `handle` (see the module
    docstring); anything else that is read passes through."""
    scheme, _ = _split(handle)
    if scheme not in ENDPOINTS:
        yield
        return
    prepare(handle)
    try:
        yield
    except PresetError:
        raise
    except Exception as error:
        cause = _network_cause(error)
        if cause is None:
            raise
        problem = _probed.get(scheme) or f"{type(cause).__name__}: {cause}"
        raise PresetError(_unreachable_message(handle, scheme, problem)) from error


def prepare(handle):
    """Checks that the hub of `handle` can be reached, and what follows if
    not (see the module docstring), before the handle is read."""
    scheme, repo = _split(handle)
    if scheme not in ENDPOINTS or (scheme == "hf" and _offline_setting()):
        return
    problem = _probe(scheme)
    if problem is None:
        return
    if scheme == "hf":
        _go_offline()
    elif len(repo.split("/")) < 5:  # no version: kagglehub asks the hub for the latest
        raise PresetError(_unreachable_message(handle, scheme, problem, "finding its latest version needs the hub"))


def unreachable(handle):
    """What kept `prepare` from reaching the hub of `handle`, or None."""
    return _probed.get(_split(handle)[0])


def _unreachable_message(handle, scheme, problem, why="the model is not in the local cache"):
    return f"Cannot read {handle!r}: {HUB_NAMES[scheme]} cannot be reached ({problem}), and {why}. {offline_help(handle)}"


def _split(handle):
    scheme, _, repo = str(handle).partition("://")
    return scheme.lower(), repo.strip("/")


def _offline_setting():
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _go_offline():
    """huggingface_hub's offline mode, as `HF_HUB_OFFLINE=1` sets it: read
    at its import, and by its calls from its `constants` module."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def _address(scheme):
    """`(host, port)` that a request to the hub connects to first: the
    proxy the environment names for it, else the hub."""
    endpoint = os.environ.get("HF_ENDPOINT", ENDPOINTS["hf"]) if scheme == "hf" else ENDPOINTS[scheme]
    url = urllib.parse.urlsplit(endpoint)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def _probe(scheme):
    """None if the hub takes a connection within `PROBE_SECONDS` (once per
    process), else what went wrong. In a thread: resolving a name has no
    timeout of its own."""
    if scheme not in _probed:
        host, port = _address(scheme)
        found = []

        def connect():
            try:
                socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
                found.append(None)
            except OSError as error:
                found.append(f"{host}: {error.strerror or error}")

        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        thread.join(PROBE_SECONDS + 0.5)
        _probed[scheme] = found[0] if found else f"{host}: no answer within {PROBE_SECONDS:g} s"
    return _probed[scheme]


def _network_cause(error):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _NETWORK_ERRORS & {cls.__name__ for cls in type(error).__mro__}:
            return error
        error = error.__cause__ or error.__context__
    return None
