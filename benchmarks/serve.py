"""Sentences a second through `keras-transformer serve` with 1, 8, 32 and
64 concurrent clients, against `generate` batched in this process, in one
run.

    python benchmarks/serve.py --preset transformer_multi30k_en_de --first-model-only --beam-size 1 \
        --data-dir PATH/TO/multi30k --sentences 256 --workers 1,2

The server runs in processes of its own (the command as users start it,
on a free port; one for each of `--workers`, serving from that many worker
processes); each client sends one sentence a request, taking the next
sentence when its answer comes, until every sentence is translated. This
process loads the same preset and translates the same sentences with
`generate(..., batch_size=--batch-size)`, the batched speed the server
aims for. Passes of each take turns (`--rounds`), so that a busy spell of
a shared host falls on all alike; the table gives the median's sentences
a second, its ratio to batched `generate`, the server's mean batch size
(`GET /metrics`) and the share of the server's translations equal to
`generate`'s. Clients and server share the machine's cores; the clients'
work is small (one HTTP request a sentence).
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

FALLBACK = [
    "A man is riding a bicycle.", "Two dogs play in the snow.", "A woman in a red dress sings on a stage.",
    "Children are playing soccer in a park.", "An old man sits on a bench.", "A girl is eating an apple.",
    "Three people are walking on the beach at sunset.", "A black dog jumps over a fence.",
]


def sentences(args):
    data_dir = args.data_dir or os.environ.get("KERAS_TRANSFORMER_MULTI30K")
    if data_dir:
        from keras_transformer.datasets import multi30k

        found = multi30k.load("test_2016_flickr", "en", "de", data_dir=data_dir)[0]
    else:
        found = FALLBACK
    return [found[i % len(found)] for i in range(args.sentences)]


def start_server(args, workers=1):
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "--preset", args.preset, "--port", "0",
               "--beam-size", str(args.beam_size), "--no-access-log", "--workers", str(workers)]
    command += ["--first-model-only"] if args.first_model_only else []
    command += ["--batch-wait-ms", str(args.batch_wait_ms)] if args.batch_wait_ms is not None else []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        found = re.search(r"Serving .* at http://([\d.]+):(\d+)/", line)
        if found:
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, found.group(1), int(found.group(2))
    raise SystemExit(f"the server did not start (exit status {process.wait()})")


def call(host, port, method, path, body=None, connection=None):
    """One request's JSON answer, on `connection` (kept open) or a new one."""
    own = connection is None
    connection = connection or http.client.HTTPConnection(host, port, timeout=600)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {answer}")
        return answer
    finally:
        if own:
            connection.close()


def through_server(host, port, texts, clients):
    """(seconds, translations, mean batch size) of `texts` sent by `clients` threads."""
    todo = queue.Queue()
    for i, text in enumerate(texts):
        todo.put((i, text))
    out = [None] * len(texts)

    def client():  # one connection, kept alive, as an HTTP client library keeps it
        connection = http.client.HTTPConnection(host, port, timeout=600)
        try:
            while True:
                try:
                    i, text = todo.get_nowait()
                except queue.Empty:
                    return
                out[i] = call(host, port, "POST", "/translate", {"q": text, "source": "en", "target": "de"},
                              connection)["translatedText"]
        finally:
            connection.close()

    before = call(host, port, "GET", "/metrics")["batches"]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    seconds = time.perf_counter() - started
    after = call(host, port, "GET", "/metrics")["batches"]
    batches = after["count"] - before["count"]
    return seconds, out, (after["sentences"] - before["sentences"]) / max(1, batches)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="transformer_multi30k_en_de")
    parser.add_argument("--first-model-only", action="store_true")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-wait-ms", type=float, help="the server's (default: its default)")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--clients", default="1,8,32,64", help="numbers of concurrent clients (default: 1,8,32,64)")
    parser.add_argument("--rounds", type=int, default=3, help="passes of each, taken in turn (default: 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="generate's batch size (default: 32)")
    parser.add_argument("--data-dir", help="Multi30k's raw files (default: $KERAS_TRANSFORMER_MULTI30K, else 8 "
                        "sentences repeated)")
    parser.add_argument("--workers", default="1", help="the servers' --workers, one server each (default: 1)")
    args = parser.parse_args()
    texts = sentences(args)
    clients = [int(c) for c in args.clients.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    from keras_transformer.models import TransformerSeq2SeqLM

    model = TransformerSeq2SeqLM.from_preset(args.preset, load_ensemble=not args.first_model_only)
    decoding = {"sampler": "greedy"} if args.beam_size == 1 else {"beam_size": args.beam_size}
    model.generate(texts[: args.batch_size], batch_size=args.batch_size, **decoding)  # warm
    servers = {w: start_server(args, w) for w in workers}
    runs = [(w, n) for w in workers for n in clients]
    times = {"generate": [], **{run: [] for run in runs}}
    batch_sizes = {run: [] for run in runs}
    same, statuses = {}, {}
    try:
        for _, host, port in servers.values():
            through_server(host, port, texts[:8], 8)  # warm: the batch sizes of a few clients
        for _ in range(args.rounds):  # in turn, so that a busy spell of the host falls on all alike
            started = time.perf_counter()
            batched = model.generate(texts, batch_size=args.batch_size, **decoding)
            times["generate"].append(time.perf_counter() - started)
            for w, n in runs:
                _, host, port = servers[w]
                seconds, out, mean_batch = through_server(host, port, texts, n)
                times[w, n].append(seconds)
                batch_sizes[w, n].append(mean_batch)
                same[w, n] = sum(a == b for a, b in zip(out, batched)) / len(texts)
    finally:
        for w, (process, _, _) in servers.items():
            process.send_signal(signal.SIGTERM)
            statuses[w] = process.wait()
    import keras

    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"{len(texts)} sentences, {args.preset}{' (first model)' if args.first_model_only else ''}, "
          f"beam {args.beam_size}, backend {keras.config.backend()}, {os.cpu_count()} cores, median of "
          f"{args.rounds} rounds; servers' exit statuses {sorted(set(statuses.values()))}")
    print(f"{'':<34} {'seconds':>8} {'sentences/s':>12} {'vs generate':>12} {'mean batch':>11}  same text")
    print(f"{f'generate, batch {args.batch_size}':<34} {median['generate']:8.2f} "
          f"{len(texts) / median['generate']:12.1f} {1.0:12.2f} {'':>11}")
    for w, n in runs:
        name = f"server, {n} client{'s' if n > 1 else ''}" + (f", {w} workers" if w > 1 else "")
        print(f"{name:<34} {median[w, n]:8.2f} {len(texts) / median[w, n]:12.1f} "
              f"{median['generate'] / median[w, n]:12.2f} {statistics.median(batch_sizes[w, n]):11.1f}  "
              f"{same[w, n]:.0%}")


if __name__ == "__main__":
    main()
