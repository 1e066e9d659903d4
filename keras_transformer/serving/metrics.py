"""What `GET /metrics` reports: requests, sentences, errors, latency
percentiles and the sizes of the batches decoded together.

Counted by the event loop (requests) and the decoding thread (batches),
under one lock.
"""

import threading
import time
from collections import Counter
from collections import deque

# Latency percentiles are of the last this many translation requests.
LATENCY_WINDOW = 4096


def percentile(values, q):
    """The nearest-rank `q`-th percentile of `values` (None for none).

    >>> percentile([4, 1, 3, 2], 50), percentile([4, 1, 3, 2], 99), percentile([], 50)
    (2, 4, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return ordered[int(rank) - 1]


def size_bucket(size):
    """The histogram bucket of a batch of `size` sentences: powers of two.

    >>> [size_bucket(n) for n in (1, 2, 3, 4, 7, 8, 33)]
    ['1', '2-3', '2-3', '4-7', '4-7', '8-15', '32-63']
    """
    low = 1 << (size.bit_length() - 1)
    return "1" if low == 1 else f"{low}-{2 * low - 1}"


class Metrics:
    """Counters of a running server (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._requests = 0
        self._sentences = 0
        self._in_flight = 0
        self._statuses = Counter()
        self._disconnects = 0
        self._latencies = deque(maxlen=LATENCY_WINDOW)
        self._batches = 0
        self._batch_sentences = 0
        self._batch_max = 0
        self._batch_histogram = Counter()
        self._decoding_seconds = 0.0

    def request_started(self, sentences):
        """A translation request whose `sentences` are queued."""
        with self._lock:
            self._in_flight += 1
            self._sentences += sentences

    def request_finished(self, status, seconds, started=True):
        """A translation request answered with `status` after `seconds`
        (`started`: it had been counted by `request_started`)."""
        with self._lock:
            self._requests += 1
            self._statuses[status] += 1
            if started:
                self._in_flight -= 1
            if status == 200:
                self._latencies.append(seconds)

    def disconnected(self, started=True):
        """A client that left before its translations were ready
        (`started`: its request had been counted by `request_started`)."""
        with self._lock:
            self._disconnects += 1
            if started:
                self._in_flight -= 1

    def batch_decoded(self, size, seconds):
        """A batch of `size` sentences decoded together in `seconds`."""
        with self._lock:
            self._batches += 1
            self._batch_sentences += size
            self._batch_max = max(self._batch_max, size)
            self._batch_histogram[size_bucket(size)] += 1
            self._decoding_seconds += seconds

    def snapshot(self, queued=0):
        """The counters as `GET /metrics` returns them (`queued`: the
        sentences waiting for the decoding thread)."""
        with self._lock:
            latencies = list(self._latencies)
            errors = sum(count for status, count in self._statuses.items() if status >= 400)
            return {
                "uptime_seconds": round(time.monotonic() - self._started, 3),
                "requests": self._requests,
                "requests_in_flight": self._in_flight,
                "sentences": self._sentences,
                "errors": errors,
                "responses_by_status": {str(status): count for status, count in sorted(self._statuses.items())},
                "disconnects": self._disconnects,
                "latency_seconds": {
                    f"p{q}": None if not latencies else round(percentile(latencies, q), 6) for q in (50, 90, 99)
                } | {"count": len(latencies)},
                "batches": {
                    "count": self._batches,
                    "sentences": self._batch_sentences,
                    "mean_size": round(self._batch_sentences / self._batches, 3) if self._batches else None,
                    "max_size": self._batch_max,
                    "size_histogram": dict(sorted(self._batch_histogram.items(), key=lambda item: int(
                        item[0].split("-")[0]))),
                    "decoding_seconds": round(self._decoding_seconds, 3),
                },
                "queued_sentences": queued,
            }
