"""`keras-transformer serve`: LibreTranslate's API over HTTP, its errors,
dynamic batching, a client that leaves, SIGTERM, and the page in a
headless Chromium.

One server process for the module (the shipped en-de preset's first
model, greedy, also served as fr-de, and the de-en one's), started on a
free port and driven with `http.client`; its
translations are compared with `generate` in this process, one sentence
at a time. The module's last test stops it with SIGTERM. The parts that
need no model (the registry, the batcher, a request's checks) are tested
in this process with stand-ins.
"""

import concurrent.futures
import contextlib
import http.client
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import keras
import pytest
from helpers import once

from keras_transformer.serving.batcher import Batcher
from keras_transformer.serving.batcher import Job
from keras_transformer.serving.errors import ApiError
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.registry import Registry
from keras_transformer.serving.registry import ServedModel
from keras_transformer.serving.registry import UnknownPair
from keras_transformer.serving.translate_request import Limits
from keras_transformer.serving.translate_request import body_fields
from keras_transformer.serving.translate_request import check_request

PRESET = "transformer_multi30k_en_de"
REVERSE = "transformer_multi30k_de_en"
SENTENCES = [
    "A man is riding a bicycle.",
    "Two dogs play in the snow.",
    "A woman in a red dress sings on a stage.",
    "Children are playing soccer in a park.",
    "An old man sits on a bench.",
    "A girl is eating an apple.",
    "Three people are walking on the beach at sunset.",
    "A black dog jumps over a fence.",
    "A group of men are working on a roof.",
    "The boy throws a ball to his father.",
    "A cook prepares food in a restaurant kitchen.",
    "Two women are talking on the street.",
    "A little girl in a pink shirt climbs a tree.",
    "People are waiting for the train.",
    "A man with a hat plays the guitar.",
    "A brown horse runs through a field.",
]
MAX_CHARS, MAX_SENTENCES = 3000, 40
class Server:
    """The server process, its base URL and the lines it logged."""

    def __init__(self, process, lines):
        self.process, self.lines, self.log = process, lines, []
        self.host, self.port = None, None

    def wait_until_serving(self, seconds=300):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line is None:
                break
            self.log.append(line)
            found = re.search(r"Serving .* at http://([\d.]+):(\d+)/", line)
            if found:
                self.host, self.port = found.group(1), int(found.group(2))
                return
        pytest.fail("the server did not start:\n" + "".join(self.log))

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, parsed JSON or text) of one request."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body, headers = json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            data = response.read().decode("utf-8")
            kind = response.getheader("content-type") or ""
            return response.status, json.loads(data) if "json" in kind else data
        finally:
            connection.close()

    def translate(self, q, **fields):
        return self.request("POST", "/translate", {"q": q, "source": "en", "target": "de", **fields})

    def metrics(self):
        return self.request("GET", "/metrics")[1]


@contextlib.contextmanager
def started_server(*options):
    """`keras-transformer serve` with `options` in a process of its own, once
    it serves (its output read as it comes); terminated at the end if it
    still runs."""
    pytest.importorskip("fastapi", reason='needs FastAPI and uvicorn: pip install "keras-aiayn[serve]"')
    pytest.importorskip("uvicorn", reason='needs FastAPI and uvicorn: pip install "keras-aiayn[serve]"')
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "--port", "0", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = queue.Queue()

    def read():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    running = Server(process, lines)
    try:
        running.wait_until_serving()
        yield running
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def server():
    # The presets that language detection picks among (en-de, the same
    # model as fr-de, and de-en), where those tests run: in PyTorch's run.
    # The other backends' runs translate en-de only (a model each loads).
    others = ["--preset", f"{PRESET}=fr-de", "--preset", REVERSE] if keras.config.backend() == "torch" else []
    with started_server(
        "--preset", PRESET, *others, "--first-model-only", "--beam-size", "1", "--batch-wait-ms", "20",
        "--max-request-chars", str(MAX_CHARS), "--max-sentences", str(MAX_SENTENCES), "--no-access-log",
    ) as running:
        yield running


@pytest.fixture(scope="module")
def expected():
    """`generate`'s translation of each sentence, one at a time, with the
    server's model and settings."""
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(PRESET, load_ensemble=False)
    found = {}

    def translation(text, **options):
        key = (text, *sorted(options.items()))
        if key not in found:
            found[key] = model.generate(text, sampler="greedy", **options)
        return found[key]

    return translation


def test_translate_one_text_and_a_list(server, expected):
    status, answer = server.translate(SENTENCES[0])
    assert (status, answer) == (200, {"translatedText": expected(SENTENCES[0])})
    # A list, decoded together in the server's thread; an empty text is an empty translation.
    status, answer = server.translate([SENTENCES[1], "", SENTENCES[0]])
    assert (status, answer) == (200, {"translatedText": [expected(SENTENCES[1]), "", expected(SENTENCES[0])]})


@once
def test_documents_and_html_come_back_translated_sentence_by_sentence(server, expected):
    """Each text is a document: its sentences are translated one by one
    (as `generate` translates each alone), its paragraphs, whitespace and
    markup kept."""
    first, second, third = SENTENCES[:3]
    text = f"  {first} {second}\n\n{third}\n"
    status, answer = server.translate(text)
    assert (status, answer) == (
        200, {"translatedText": f"  {expected(first)} {expected(second)}\n\n{expected(third)}\n"})
    page = (f'<p class="a">{first} {second}</p>\n<p title="{third}">{third}</p><script>var x = "{first}";</script>'
            f'<code translate="no">{second}</code>')
    status, answer = server.translate([page, "<br>"], format="html")
    assert status == 200
    assert answer == {"translatedText": [
        f'<p class="a">{expected(first)} {expected(second)}</p>\n<p title="{expected(third)}">{expected(third)}</p>'
        f'<script>var x = "{first}";</script><code translate="no">{second}</code>',
        "<br>",  # (markup alone: nothing to translate)
    ]}
    # Inline elements: sentences translated whole, the elements around
    # the words aligned with theirs (on the server's decoding thread).
    page = f"<p>{first.replace('bicycle', '<b>bicycle</b>')} {SENTENCES[6].replace('beach', '<i>beach</i>')}</p>"
    before = server.metrics()
    status, answer = server.translate(page, format="html")
    assert (status, answer) == (200, {"translatedText": expected(page, format="html", split_sentences=True)})
    assert "<b>" in answer["translatedText"] and "<i>" in answer["translatedText"]
    after = server.metrics()  # (one request, one batch of its 2 sentences: the alignment's is not counted)
    assert [after[key] - before[key] for key in ("requests", "sentences")] == [1, 2]
    assert [after["batches"][key] - before["batches"][key] for key in ("count", "sentences")] == [1, 2]
    # A paragraph longer than the model reads: each of its sentences translated.
    status, answer = server.translate(" ".join([first] * 60))
    assert (status, answer) == (200, {"translatedText": " ".join([expected(first)] * 60)})


@once
def test_form_bodies_and_source_auto(server, expected):
    form = urllib.parse.urlencode({"q": SENTENCES[4], "source": "auto", "target": "de"})
    status, answer = server.request(
        "POST", "/translate", form, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 200
    # German is served from English and (the same model, as `=fr-de`) from
    # French: the sentence's language is detected, and named as
    # LibreTranslate names it.
    detected = answer.pop("detectedLanguage")
    assert answer == {"translatedText": expected(SENTENCES[4])}
    assert detected["language"] == "en" and 50 < detected["confidence"] <= 100, detected
    french = ["Un homme fait du vélo dans la rue.", "Deux chiens jouent dans la neige."]
    status, answer = server.request("POST", "/translate", {"q": french, "source": "AUTO", "target": "de"})
    assert status == 200 and [d["language"] for d in answer["detectedLanguage"]] == ["fr", "fr"], answer
    assert answer["translatedText"] == [expected(text) for text in french]  # (the en-de model, served as fr-de)
    # German is served from one language only: no detection needed.
    status, answer = server.request("POST", "/translate", {"q": "Ein Hund.", "target": "en"})
    assert (status, answer["detectedLanguage"]) == (200, {"confidence": 100.0, "language": "de"}), answer


@once
def test_languages_health_and_metrics(server):
    status, languages = server.request("GET", "/languages")
    assert status == 200
    assert {"code": "en", "name": "English", "targets": ["de"]} in languages
    assert server.request("GET", "/health") == (
        200, {"status": "ok", "models": [PRESET, PRESET, REVERSE], "pairs": ["en-de", "fr-de", "de-en"], "workers": 1}
    )
    server.translate(SENTENCES[5])
    metrics = server.metrics()
    assert metrics["requests"] >= 1 and metrics["sentences"] >= 1
    assert metrics["batches"]["count"] >= 1
    assert set(metrics["latency_seconds"]) == {"p50", "p90", "p99", "count"}
    assert 0 < metrics["latency_seconds"]["p50"] <= metrics["latency_seconds"]["p99"]


@once
@pytest.mark.parametrize(
    "body, headers, status, says",
    [
        ("{not json", {"Content-Type": "application/json"}, 400, "not valid JSON"),
        ('["a list"]', {"Content-Type": "application/json"}, 400, "JSON object"),
        ({"source": "en", "target": "de"}, None, 400, "missing q parameter"),
        ({"q": "A dog.", "source": "en"}, None, 400, "missing target parameter"),
        ({"q": 3, "source": "en", "target": "de"}, None, 422, "q must be a string or a list of strings"),
        ({"q": ["A dog.", None], "source": "en", "target": "de"}, None, 422, "a list holding null"),
        ({"q": "A dog.", "source": "en", "target": ["de"]}, None, 422, "target must be a string"),
        ({"q": "A dog.", "source": "en", "target": "de", "format": "pdf"}, None, 400, "'pdf' format"),
        ({"q": "A dog.", "source": "en", "target": "fr"}, None, 400,
         "en-fr is not served: this server translates en-de, fr-de, de-en"),
        ({"q": "A dog.", "source": "cs", "target": "en"}, None, 400, "cs-en is not served"),
        ({"q": "x" * (MAX_CHARS + 1), "source": "en", "target": "de"}, None, 413, f"limit of {MAX_CHARS} characters"),
        ({"q": ["A dog."] * (MAX_SENTENCES + 1), "source": "en", "target": "de"}, None, 413,
         f"limit of {MAX_SENTENCES} texts"),
    ],
)
def test_bad_requests_are_json_errors(server, body, headers, status, says):
    got, answer = server.request("POST", "/translate", body, headers)
    assert got == status, answer
    assert set(answer) == {"error"} and says in answer["error"], answer
    assert "Traceback" not in answer["error"]


@once
def test_other_routes_and_methods_are_json_errors(server):
    assert server.request("GET", "/no-such-page") == (404, {"error": "Not Found"})
    assert server.request("GET", "/translate") == (405, {"error": "Method Not Allowed"})
    assert server.request("GET", "/health")[0] == 200  # still serving


@once
def test_translate_answers_carry_cors_headers_and_the_schema_documents_it(server, expected):
    """`POST /translate` (on its fast path past FastAPI's routing) answers
    pages of other origins as the other routes do, and /docs' schema
    still lists it."""
    def raw(method, path, body=None, headers=()):
        connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
        try:
            connection.request(method, path, body=body, headers={"Origin": "http://example.org", **dict(headers)})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    body = json.dumps({"q": SENTENCES[8], "source": "en", "target": "de"})
    for path, method, data in (("/translate", "POST", body), ("/translate", "POST", "{not json"),
                               ("/health", "GET", None)):
        status, headers, _ = raw(method, path, data, {"Content-Type": "application/json"})
        assert status in (200, 400) and headers.get("access-control-allow-origin") == "*", (path, data, headers)
    status, headers, answer = raw("POST", "/translate", body, {"Content-Type": "application/json"})
    assert json.loads(answer) == {"translatedText": expected(SENTENCES[8])}
    status, headers, _ = raw("OPTIONS", "/translate", None, {"Access-Control-Request-Method": "POST"})
    assert status == 200 and "POST" in headers.get("access-control-allow-methods", "")
    status, schema = server.request("GET", "/openapi.json")
    assert status == 200 and "post" in schema["paths"]["/translate"]


@once
def test_the_fast_path_answers_errors_as_the_other_routes_do():
    """`TranslateFastPath`, driven as uvicorn drives it: its handler's
    dict as JSON, an `ApiError` as its status, anything else a 500 that
    names it (no traceback), and every other request handed on."""
    import asyncio

    from keras_transformer.serving.translate_route import TranslateFastPath

    def call(application, method, path):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
        asyncio.run(application(scope, receive, send))
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))

    async def other(scope, receive, send):
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b'"other"'})

    def handler(outcome):
        async def translate(request):
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return translate

    assert call(TranslateFastPath(other, handler({"translatedText": "Hallo"})), "POST", "/translate") == (
        200, {"translatedText": "Hallo"})
    assert call(TranslateFastPath(other, handler(ApiError(413, "too long"))), "POST", "/translate") == (
        413, {"error": "too long"})
    assert call(TranslateFastPath(other, handler(KeyError("lost"))), "POST", "/translate") == (
        500, {"error": "Internal error: KeyError: 'lost'"})
    for method, path in (("GET", "/translate"), ("POST", "/translate/"), ("POST", "/health")):
        assert call(TranslateFastPath(other, handler(KeyError("never"))), method, path) == (204, "other")


@once  # (each backend's batched decoding in the server's thread: test_translate_one_text_and_a_list)
def test_concurrent_requests_are_decoded_together(server, expected):
    """32 clients at once: each gets generate's translation of its sentence,
    and the server decoded them in fewer batches than sentences."""
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(32)]
    wanted = [expected(text) for text in texts]
    before = server.metrics()["batches"]
    start = threading.Barrier(len(texts))

    def client(text):
        start.wait()
        return server.translate(text)

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        answers = list(pool.map(client, texts))
    assert answers == [(200, {"translatedText": translation}) for translation in wanted]
    after = server.metrics()["batches"]
    batches, sentences = after["count"] - before["count"], after["sentences"] - before["sentences"]
    assert sentences == len(texts)
    assert batches < sentences, f"{sentences} sentences in {batches} batches"
    assert after["max_size"] > 1


@once
def test_a_client_that_leaves_or_dawdles_does_not_block_others(server, expected):
    before = server.metrics()["disconnects"]
    body = json.dumps({"q": SENTENCES * 2, "source": "en", "target": "de"}).encode()
    head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with socket.create_connection((server.host, server.port)) as slow:
        slow.sendall(head % len(body) + body[:20])  # the rest of its body never comes
        with socket.create_connection((server.host, server.port)) as leaving:
            leaving.sendall(head % len(body) + body)
        assert server.translate(SENTENCES[6]) == (200, {"translatedText": expected(SENTENCES[6])})
    # Both counted: the one that left waiting for its translations (its
    # sentences leave the queue), the one that left before its body came.
    deadline = time.monotonic() + 60
    while server.metrics()["disconnects"] < before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metrics()["disconnects"] == before + 2
    assert server.metrics()["requests_in_flight"] == 0


class FakeModel:
    """A stand-in of a translation model: its `languages`, and the calls of `generate`."""

    def __init__(self, languages=(), fail_on=None):
        self.languages, self.fail_on, self.calls = list(languages), fail_on, []

    def generate(self, texts, **kwargs):
        self.calls.append((list(texts), kwargs))
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError(f"cannot translate {self.fail_on!r}")
        return [f"<{text}>" for text in texts]


@once
def test_registry_serves_each_pair_from_the_first_preset_that_has_it():
    bilingual = ServedModel("en-de", FakeModel(), {"sampler": "greedy"}, ("en", "de"))
    m2m = ServedModel("m2m", FakeModel(["__en__", "__de__", "__fr__"]), {}, None)
    opus = ServedModel("opus", FakeModel([">>de<<", ">>es<<"]), {}, ("en", "mul"))
    registry = Registry([bilingual, m2m, opus])
    assert sorted(registry.pairs) == ["de-en", "de-fr", "en-de", "en-es", "en-fr", "fr-de", "fr-en"]
    assert registry.route("en", "de").served is bilingual
    route = registry.route("FR", "de")
    assert (route.served, route.source_language, route.target_language, route.pair) == (m2m, "__fr__", "__de__",
                                                                                        ("fr", "de"))
    route = registry.route("en", "es")
    assert (route.served, route.source_language, route.target_language) == (opus, None, ">>es<<")
    assert registry.route("auto", "es").pair == ("en", "es")
    assert registry.route(None, "es").pair == ("en", "es")
    assert registry.needs_detection()  # (de from en and fr)
    with pytest.raises(UnknownPair, match=r"served from en, fr, needs language detection \(py3langid"):
        registry.route("auto", "de")
    with pytest.raises(UnknownPair, match="xx-de is not served: this server translates en-de, "):
        registry.route("xx", "de")
    assert {"code": "fr", "name": "French", "targets": ["de", "en"]} in registry.languages()
    assert {"code": "es", "name": "Spanish", "targets": []} in registry.languages()
    # generate gets the model's own codes and the server's settings, all texts at once.
    assert registry.route("de", "fr").generate(["a", "b"]) == ["<a>", "<b>"]
    assert m2m.model.calls[-1] == (["a", "b"], {"batch_size": 2, "verbose": 0, "source_language": "__de__",
                                               "target_language": "__fr__"})
    registry.route("en", "de").generate(["c"])
    assert bilingual.model.calls[-1] == (["c"], {"batch_size": 1, "verbose": 0, "sampler": "greedy"})
    with pytest.raises(ValueError, match="names no languages .* as runs/x=en-de"):
        Registry([ServedModel("runs/x", FakeModel(), {}, None)])


@once
def test_source_auto_is_the_served_source_the_text_is_in():
    pytest.importorskip("py3langid", reason='needs py3langid: pip install "keras-aiayn[serve]"')
    from keras_transformer.serving.language_detection import LanguageDetector

    m2m = ServedModel("m2m", FakeModel(["__en__", "__de__", "__fr__", "__cs__"]), {}, None)
    registry = Registry([m2m], detector=LanguageDetector())
    # py3langid's own answer among the three sources, renormalized.
    from py3langid.langid import MODEL_FILE
    from py3langid.langid import LanguageIdentifier

    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    reference.set_languages(["cs", "en", "fr"])
    for text, language in (("Un homme fait du vélo dans la rue.", "fr"), ("A man rides a bicycle down the street.",
                           "en"), ("Muž jede na kole po ulici.", "cs")):
        source, confidence = registry.detect_source("de", text)
        assert source == language == reference.classify(text)[0]
        assert confidence == pytest.approx(100 * reference.classify(text)[1], abs=0.01)
        assert registry.route("auto", "de", text).pair == (language, "de")
    # A target served from one source needs no detection.
    one = Registry([ServedModel("en-de", FakeModel(), {}, ("en", "de"))], detector=LanguageDetector())
    assert not one.needs_detection() and one.detect_source("de", "Un homme.") == ("en", 100.0)
    with pytest.raises(UnknownPair, match="no model translates into 'es'"):
        registry.detect_source("es", "Hola.")
    nllb = Registry([ServedModel("nllb", FakeModel(["ace_Arab", "ace_Latn", "deu_Latn"]), {}, None)],
                    detector=LanguageDetector())
    with pytest.raises(UnknownPair, match=r"knows none of its sources \(ace_Arab, ace_Latn\)"):
        nllb.route("auto", "de", "Dua anjing.")
    # The model's own codes, in any case.
    assert nllb.route("ACE_arab", "de").source_language == "ace_Arab"
    assert nllb.route("de", "ace_Latn").target_language == "ace_Latn"


class FakeRoute:
    counted = True

    def __init__(self, name, model):
        self.key, self.model = name, model

    def generate(self, texts):
        return self.model.generate(texts)


def _job(route, texts, outcomes, client=None):
    done = threading.Event()

    def deliver(outcome):
        outcomes[tuple(texts)] = outcome
        done.set()

    job = Job(route, texts, deliver, client)
    job.answered = done
    return job


@once
def test_the_batcher_decodes_queued_sentences_of_a_route_together_within_the_budget():
    model = FakeModel()
    a, b = FakeRoute("a", model), FakeRoute("b", model)
    metrics, outcomes = Metrics(), {}
    # Four short sentences fit (4 x 2 estimated tokens), five do not.
    batcher = Batcher(metrics, max_batch_tokens=8, batch_wait=0)
    jobs = [_job(a, ["a1", "a2", "a3"], outcomes), _job(b, ["b1"], outcomes), _job(a, ["a4", "a5"], outcomes),
            _job(a, ["gone"], outcomes)]
    for job in jobs:
        batcher.submit(job)
    batcher.cancel(jobs[3])  # its client left: never decoded
    batcher.start()
    batcher.close(timeout=30)
    assert [texts for texts, _ in model.calls] == [["a1", "a2", "a3", "a4"], ["b1"], ["a5"]]
    assert outcomes == {
        ("a1", "a2", "a3"): ["<a1>", "<a2>", "<a3>"], ("b1",): ["<b1>"], ("a4", "a5"): ["<a4>", "<a5>"]
    }
    assert metrics.snapshot()["batches"] | {"decoding_seconds": 0} == {
        "count": 3, "sentences": 6, "mean_size": 2.0, "max_size": 4, "size_histogram": {"1": 2, "4-7": 1},
        "decoding_seconds": 0}
    with pytest.raises(RuntimeError, match="shutting down"):
        batcher.submit(_job(a, ["late"], outcomes))


@once
def test_a_failing_batch_fails_only_the_request_that_causes_it():
    model = FakeModel(fail_on="bad")
    route, outcomes = FakeRoute("a", model), {}
    batcher = Batcher(Metrics(), batch_wait=0)
    for texts in (["ok1"], ["bad", "ok2"], ["ok3"]):
        batcher.submit(_job(route, texts, outcomes))
    batcher.start()
    batcher.close(timeout=30)
    assert model.calls[0][0] == ["ok1", "bad", "ok2", "ok3"]  # together first, then request by request
    assert outcomes[("ok1",)] == ["<ok1>"] and outcomes[("ok3",)] == ["<ok3>"]
    assert isinstance(outcomes[("bad", "ok2")], ValueError)


@once
def test_the_batcher_waits_for_sentences_that_arrive_together():
    model = FakeModel()
    route, outcomes = FakeRoute("a", model), {}
    batcher = Batcher(Metrics(), batch_wait=0.5)
    batcher.start()
    jobs = [_job(route, [f"s{i}"], outcomes) for i in range(4)]
    for job in jobs:
        batcher.submit(job)
    for job in jobs:
        assert job.answered.wait(30)
    batcher.close(timeout=30)
    assert [texts for texts, _ in model.calls] == [["s0", "s1", "s2", "s3"]]


@once
def test_a_batch_waits_for_the_clients_the_last_batch_answered():
    # Four clients, each sending its next sentence 10, 40, 70 and 100 ms
    # after its answer: further apart than the batch's short wait (5 ms),
    # within a quarter of a batch's 0.8 s. Every batch after the first holds
    # all four; with the short wait alone, each client's sentence went alone.
    # (The batcher starts once the four are queued, so that they make the
    # first batch on a busy machine too.)
    sizes = _batch_sizes_of_clients(Slow(0.8), 4, rounds=4, pause=lambda number: 0.01 + 0.03 * number, gather=4)
    assert sizes == [4, 4, 4, 4], sizes


def _batch_sizes_of_clients(model, clients, rounds, pause, start=lambda number: None, batch_wait=0.005,
                            known=False, gather=0):
    """The sizes of the batches `model` decoded for `clients` threads, each
    sending one sentence at a time for `rounds` rounds through a batcher
    (its short wait `batch_wait`) and waiting `pause(number)` seconds after
    each answer; `start(number)` runs before a client's first sentence.
    `known`: each client's jobs name it (as a connection's address).
    `gather`: the batcher starts once this many sentences are queued."""
    route, outcomes = FakeRoute("a", model), {}
    batcher = Batcher(Metrics(), batch_wait=batch_wait)
    queued, lock = [0], threading.Lock()
    if not gather:
        batcher.start()

    def client(number):
        start(number)
        for round_ in range(rounds):
            job = _job(route, [f"c{number}r{round_}"], outcomes, client=("127.0.0.1", number) if known else None)
            batcher.submit(job)
            with lock:
                queued[0] += 1
                if queued[0] == gather:
                    batcher.start()
            assert job.answered.wait(30)
            time.sleep(pause(number))

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    batcher.close(timeout=30)
    return [len(texts) for texts, _ in model.calls]


class Slow(FakeModel):
    """A model whose `generate` takes `seconds`; `decoding` is set once it
    has begun; `times` holds each call's start and end."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.decoding, self.times = seconds, threading.Event(), []

    def generate(self, texts, **kwargs):
        self.decoding.set()
        started = time.monotonic()
        time.sleep(self.seconds)
        self.times.append((started, time.monotonic()))
        return super().generate(texts, **kwargs)


@once
def test_a_batch_starts_once_every_client_the_last_one_answered_is_back():
    # Four clients on connections of their own, each back 10-25 ms after its
    # answer. Once all four are, nobody else is on the way: the next batch
    # starts without its short wait (here 0.5 s; were it waited for, every
    # batch would start 0.5 s after the last client came back).
    model = Slow(0.2)
    sizes = _batch_sizes_of_clients(model, 4, rounds=4, pause=lambda number: 0.01 + 0.005 * number,
                                    start=lambda number: number and model.decoding.wait(30), batch_wait=0.5,
                                    known=True)
    # (The first client's sentence alone, then all four; the last three's
    # fourth round once the first is done.)
    assert sizes == [1, 4, 4, 4, 3], sizes
    # Between the batches of all four (the last one waits for the client
    # that is done, as it would for a client that is slow to come back).
    gaps = [later[0] - earlier[1] for earlier, later in zip(model.times[:3], model.times[1:4])]
    assert max(gaps) < 0.25, gaps


@once
def test_the_clients_queued_and_those_answered_make_one_batch():
    # Eight clients, each sending its next sentence 20 ms after its answer.
    # The first batch holds the four that came first; the other four queue
    # while it decodes. The next batch waits for the four it answered and
    # holds all eight; were the four queued enough to start it, the clients
    # would take turns in batches of four.
    model = Slow(0.3)

    def start(number):  # the last four once the first batch decodes
        if number >= 4:
            assert model.decoding.wait(30)

    # (The batcher starts once the first four are queued, so that they make
    # the first batch on a busy machine too.)
    sizes = _batch_sizes_of_clients(model, 8, rounds=3, pause=lambda number: 0.02, start=start, gather=4)
    assert sizes[:3] == [4, 8, 8], sizes


class Stopping(FakeModel):
    """A model whose decoding stops its thread."""

    def generate(self, texts, **kwargs):
        raise SystemExit("stopped")


@once
def test_requests_are_answered_when_the_decoding_thread_stops():
    route, outcomes = FakeRoute("a", Stopping()), {}
    batcher = Batcher(Metrics(), batch_wait=0)
    jobs = [_job(route, ["s1"], outcomes), _job(route, ["s2"], outcomes)]
    for job in jobs:
        batcher.submit(job)
    batcher.start()
    for job in jobs:
        assert job.answered.wait(30)
    assert all(isinstance(outcome, RuntimeError) and "decoding thread stopped" in str(outcome)
               for outcome in outcomes.values())
    batcher.close(timeout=30)
    assert not batcher.alive
    with pytest.raises(RuntimeError):
        batcher.submit(_job(route, ["s3"], outcomes))


@once
def test_health_fails_once_any_workers_decoding_thread_stopped():
    """`GET /health` of a worker whose own decoding thread runs says so
    once another worker's stopped (their counters share memory)."""
    from types import SimpleNamespace

    from keras_transformer.serving.app import health_answer
    from keras_transformer.serving.metrics import CounterSlots

    shared = CounterSlots.create(2)
    try:
        first, second = (Metrics(CounterSlots.attach(shared.name, slot)) for slot in (0, 1))
        registry, running = SimpleNamespace(served=[], pairs=["en-de"]), SimpleNamespace(alive=True)
        assert health_answer(registry, running, first)[0] == 200
        stopped = Batcher(second, batch_wait=0)
        stopped.submit(_job(FakeRoute("a", Stopping()), ["s1"], {}))
        stopped.start()
        stopped.close(timeout=30)
        assert health_answer(registry, running, first) == (
            503, {"status": "error", "error": "the decoding thread stopped in 1 of 2 worker processes"})
    finally:
        first.slots.close(), second.slots.close()
        shared.unlink()


@once
def test_a_load_error_reaches_the_caller():
    def load():
        raise ValueError("no such preset")

    with pytest.raises(ValueError, match="no such preset"):
        Batcher(Metrics()).start(load=load)


@once
def test_request_checks():
    limits = Limits(max_request_chars=12, max_sentences=2)
    form = body_fields(b"q=A+dog.&q=A+cat.&target=de", "application/x-www-form-urlencoded", "source=en")
    assert check_request(form, limits) == check_request(
        {"q": ["A dog.", "A cat."], "source": "en", "target": "de"}, limits)
    checked = check_request({"q": "", "target": " de "}, limits)
    assert (checked.texts, checked.single, checked.source, checked.target, checked.format) == (
        [""], True, "auto", "de", "text")
    for fields, status in [({"q": ["a", "b", "c"], "target": "de"}, 413), ({"q": "a" * 13, "target": "de"}, 413),
                           ({"q": "a", "target": "de", "format": "pdf"}, 400), ({"q": {}, "target": "de"}, 422)]:
        with pytest.raises(ApiError) as raised:
            check_request(fields, limits)
        assert raised.value.status == status, (fields, raised.value.message)
    with pytest.raises(ApiError, match="multipart/form-data") as raised:
        body_fields(b"--x", "multipart/form-data; boundary=x")
    assert raised.value.status == 415


@once
def test_serve_without_its_packages_says_what_to_install(monkeypatch):
    from keras_transformer.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    with pytest.raises(SystemExit) as raised:
        main(["serve"])
    assert 'pip install "keras-aiayn[serve]"' in str(raised.value.code)


# Debian's Chromium and its driver (.ci/run installs them where missing).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@once
@pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Chromium and its driver (Debian: apt-get install chromium chromium-driver; .ci/run installs them)",
)
def test_the_page_translates_in_a_browser(server, expected):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import Select
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1000,620", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    # The system's driver: Selenium Manager downloads nothing.
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        browser.get(f"http://{server.host}:{server.port}/")
        wait = WebDriverWait(browser, 60)
        wait.until(expected_conditions.element_to_be_clickable((By.ID, "translate")))
        sources = Select(browser.find_element(By.ID, "source"))
        assert [option.get_attribute("value") for option in sources.options] == ["auto", "de", "en", "fr"]
        sources.select_by_value("en")  # (its targets fill the other picker)
        assert browser.find_element(By.ID, "target").get_attribute("value") == "de"
        browser.find_element(By.ID, "source-text").send_keys(SENTENCES[2])
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda driver: driver.find_element(By.ID, "translation").text)
        assert browser.find_element(By.ID, "translation").text == expected(SENTENCES[2])
        assert re.fullmatch(r"\d+ ms", browser.find_element(By.ID, "time").text)
        assert browser.find_element(By.ID, "error").text == ""
        screenshot = os.environ.get("KERAS_TRANSFORMER_SERVE_SCREENSHOT")
        if screenshot:  # docs/img/serve_page.png
            browser.save_screenshot(screenshot)
        # "Detect language": every target offered; the French sentence goes to fr-de.
        french = "Un homme fait du vélo dans la rue."
        sources.select_by_value("auto")
        targets = Select(browser.find_element(By.ID, "target"))
        assert [option.get_attribute("value") for option in targets.options] == ["de", "en"]
        targets.select_by_value("de")
        browser.find_element(By.ID, "source-text").clear()
        browser.find_element(By.ID, "source-text").send_keys(french)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda driver: "detected" in driver.find_element(By.ID, "time").text)
        assert browser.find_element(By.ID, "translation").text == expected(french)
        assert re.fullmatch(r"\d+ ms · detected French \(fr\), [\d.]+%", browser.find_element(By.ID, "time").text)
    finally:
        browser.quit()


@once
def test_sigterm_answers_the_requests_in_flight_then_exits(server, expected):
    """The module's last server test: it stops the server."""
    _sigterm_answers_what_is_in_flight(server, [SENTENCES[i:] + SENTENCES[:i] for i in range(6)], expected)


def _sigterm_answers_what_is_in_flight(server, texts, expected):
    """Sends each of `texts` (a list of sentences a request) at once, SIGTERM
    once they are all in flight: each is answered with `generate`'s
    translations, some after the signal, and the server exits with 0."""
    stopped = threading.Event()

    def client(q):
        answer = server.translate(q)
        return answer, stopped.is_set()

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(client, q) for q in texts]
        deadline = time.monotonic() + 60
        while server.metrics()["requests_in_flight"] < len(texts) and time.monotonic() < deadline:
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        stopped.set()
        results = [future.result() for future in futures]
    assert [answer for answer, _ in results] == [
        (200, {"translatedText": [expected(text) for text in q]}) for q in texts
    ]
    assert any(after for _, after in results), "every request was answered before SIGTERM: nothing was in flight"
    assert server.process.wait(120) == 0


# --- Several worker processes (--workers) ---


@once  # (the command's processes: the same on every backend)
def test_worker_processes_serve_together_count_together_and_stop_on_sigterm(expected):
    """Two workers: clients on their own connections get generate's
    translations, GET /metrics counts every worker's requests, and SIGTERM
    with requests in flight answers them all, then every process exits."""
    with started_server("--preset", PRESET, "--first-model-only", "--beam-size", "1", "--workers", "2",
                        "--no-access-log") as server:
        assert "in 2 worker processes" in server.log[-1]
        texts = [[SENTENCES[(i + j) % len(SENTENCES)] for j in range(4)] for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(server.translate, texts))
        assert answers == [(200, {"translatedText": [expected(text) for text in q]}) for q in texts]
        metrics = server.metrics()
        assert (metrics["workers"], metrics["requests"], metrics["sentences"]) == (2, 8, 32)
        assert metrics["batches"]["sentences"] == 32 and metrics["responses_by_status"] == {"200": 8}
        # Connections a client opens one after another, each kept open, go
        # to the workers in turn (shared, the first free worker took most).
        deadline = time.monotonic() + 30
        while server.metrics()["connections"]["open"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # (the clients' connections above, closing)
        kept = []
        for _ in range(32):
            kept.append(http.client.HTTPConnection(server.host, server.port, timeout=120))
            kept[-1].request("POST", "/translate", json.dumps({"q": SENTENCES[0], "source": "en", "target": "de"}),
                             {"Content-Type": "application/json"})
            assert kept[-1].getresponse().status == 200
        held = server.metrics()["connections"]["by_worker"]  # (with the request's own connection)
        assert sum(held) == 33 and max(held) - min(held) <= 1, held
        for connection in kept:
            connection.close()
        _sigterm_answers_what_is_in_flight(server, [SENTENCES] * len(texts), expected)
        with pytest.raises(OSError):  # nobody listens any more
            socket.create_connection((server.host, server.port), timeout=5).close()


@once
def test_a_worker_that_cannot_start_stops_the_command_with_its_error(tmp_path):
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "--port", "0", "--workers", "2",
               "--preset", str(tmp_path / "missing")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert f"error: Unknown preset {str(tmp_path / 'missing')!r}" in result.stderr and "Traceback" not in result.stderr
    assert "Serving" not in result.stderr + result.stdout
