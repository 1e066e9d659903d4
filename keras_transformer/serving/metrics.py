"""What `GET /metrics` reports: requests, sentences, errors, latency
percentiles and the sizes of the batches decoded together.

Counted by the event loop (requests) and the decoding thread (batches),
under one lock.
"""

import threading
import time

import numpy as np

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


# A slot's numbers: the counters, then a count for each HTTP status (100
# to 599), each batch size's bucket (`size_bucket`: powers of two), and the
# last `LATENCY_WINDOW` latencies (a ring).
_COUNTERS = ("requests", "sentences", "in_flight", "disconnects", "batches", "batch_sentences", "batch_max",
             "decoding_seconds", "latencies", "decoding_stopped", "connections_opened", "connections_closed")
_STATUSES, _FIRST_STATUS = 500, 100
_BUCKETS = 64
# Where each part of a slot starts, and its size.
_STATUS_AT = len(_COUNTERS)
_BUCKET_AT = _STATUS_AT + _STATUSES
_LATENCY_AT = _BUCKET_AT + _BUCKETS
_SLOT = _LATENCY_AT + LATENCY_WINDOW


class CounterSlots:
    """The numbers of `Metrics`, a slot a process: in this process's memory
    (one slot), or in a block of shared memory that worker processes
    attach to by its `name` (`create`, `attach`), each counting into its
    own slot.

    Example:

    >>> shared = CounterSlots.create(2)
    >>> worker = Metrics(CounterSlots.attach(shared.name, slot=1))
    >>> worker.request_started(3)
    >>> Metrics(CounterSlots.attach(shared.name, slot=0)).snapshot()["sentences"]
    3
    >>> shared.unlink()
    """

    def __init__(self, slots=1, slot=0, memory=None):
        self.slots, self.slot, self._memory = slots, slot, memory
        if memory is None:
            self.values, self.name = np.zeros((slots, _SLOT)), None
        else:
            self.values, self.name = np.ndarray((slots, _SLOT), np.float64, buffer=memory.buf), memory.name

    @classmethod
    def create(cls, slots):
        """A block of shared memory for `slots` processes (zeros), whose
        creator unlinks it once they are done."""
        from multiprocessing import shared_memory

        memory = shared_memory.SharedMemory(create=True, size=slots * _SLOT * 8)
        created = cls(slots, 0, memory)
        created.values[:] = 0
        return created

    @classmethod
    def attach(cls, name, slot):
        """The block of shared memory `name`, counting into `slot`."""
        from multiprocessing import shared_memory

        # (Its creator unlinks it. The workers that `multiprocessing` spawns
        # share their creator's resource tracker, which holds the name once.)
        memory = shared_memory.SharedMemory(name=name)
        return cls(memory.size // (_SLOT * 8), slot, memory)

    def close(self):
        """Detaches from the shared memory (a process done with it)."""
        self.values = None
        if self._memory is not None:
            self._memory.close()

    def unlink(self):
        """Frees the shared memory (its creator, once the workers ended)."""
        self.close()
        if self._memory is not None:
            self._memory.unlink()

    def counts(self, name):
        """A counter of every slot (`"connections_closed"`, say), a list."""
        return self.values[:, _column(name)].tolist()

    def own(self):
        """This process's slot: `(counters, statuses, buckets, latencies)` views."""
        row = self.values[self.slot]
        return row[:_STATUS_AT], row[_STATUS_AT:_BUCKET_AT], row[_BUCKET_AT:_LATENCY_AT], row[_LATENCY_AT:]


def _column(name):
    return _COUNTERS.index(name)


def _connections(counters):
    """The open connections in all, and each worker's."""
    held = counters[:, _column("connections_opened")] - counters[:, _column("connections_closed")]
    return {"open": int(held.sum()), "by_worker": [int(n) for n in held]}


class Metrics:
    """Counters of a running server (thread-safe), in `slots` (a
    `CounterSlots`; by default this process's own)."""

    def __init__(self, slots=None):
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.slots = slots or CounterSlots()
        self._counters, self._statuses, self._buckets, self._latencies = self.slots.own()

    def _add(self, name, value=1):
        self._counters[_column(name)] += value

    def request_started(self, sentences):
        """A translation request whose `sentences` are queued."""
        with self._lock:
            self._add("in_flight")
            self._add("sentences", sentences)

    def request_finished(self, status, seconds, started=True):
        """A translation request answered with `status` after `seconds`
        (`started`: it had been counted by `request_started`)."""
        with self._lock:
            self._add("requests")
            self._statuses[min(max(status - _FIRST_STATUS, 0), _STATUSES - 1)] += 1
            if started:
                self._add("in_flight", -1)
            if status == 200:
                count = int(self._counters[_column("latencies")])
                self._latencies[count % LATENCY_WINDOW] = seconds
                self._add("latencies")

    def disconnected(self, started=True):
        """A client that left before its translations were ready
        (`started`: its request had been counted by `request_started`)."""
        with self._lock:
            self._add("disconnects")
            if started:
                self._add("in_flight", -1)

    def batch_decoded(self, size, seconds):
        """A batch of `size` sentences decoded together in `seconds`."""
        with self._lock:
            self._add("batches")
            self._add("batch_sentences", size)
            column = _column("batch_max")
            self._counters[column] = max(self._counters[column], size)
            self._buckets[size.bit_length() - 1] += 1
            self._add("decoding_seconds", seconds)

    def connection_opened(self):
        """A client's connection, opened."""
        with self._lock:
            self._add("connections_opened")

    def connection_closed(self):
        """A client's connection, closed."""
        with self._lock:
            self._add("connections_closed")

    def decoding_stopped(self):
        """This process's decoding thread stopped (`GET /health` of every
        worker says so)."""
        with self._lock:
            self._counters[_column("decoding_stopped")] = 1

    def stopped_workers(self):
        """The slots (worker processes) whose decoding thread stopped."""
        with self._lock:
            flags = self.slots.counts("decoding_stopped")
        return [slot for slot, flag in enumerate(flags) if flag]

    def snapshot(self, queued=0):
        """The counters as `GET /metrics` returns them, every slot's added
        up (`queued`: the sentences waiting for this process's decoding
        thread)."""
        with self._lock:
            values = np.array(self.slots.values)  # (a copy: other workers write on)
        counters = values[:, :_STATUS_AT]
        statuses, buckets = values[:, _STATUS_AT:_BUCKET_AT].sum(0), values[:, _BUCKET_AT:_LATENCY_AT].sum(0)
        total = {name: counters[:, i].sum() for i, name in enumerate(_COUNTERS)}
        latencies = [latency for row, count in zip(values[:, _LATENCY_AT:], counters[:, _column("latencies")])
                     for latency in row[: min(int(count), LATENCY_WINDOW)]]
        batches, batch_sentences = int(total["batches"]), int(total["batch_sentences"])
        return {
            "uptime_seconds": round(time.monotonic() - self._started, 3),
            "workers": self.slots.slots,
            "requests": int(total["requests"]),
            "requests_in_flight": int(total["in_flight"]),
            "sentences": int(total["sentences"]),
            "errors": int(statuses[400 - _FIRST_STATUS:].sum()),
            "responses_by_status": {str(i + _FIRST_STATUS): int(n) for i, n in enumerate(statuses) if n},
            "disconnects": int(total["disconnects"]),
            "connections": _connections(counters),
            "latency_seconds": {
                f"p{q}": None if not latencies else round(float(percentile(latencies, q)), 6) for q in (50, 90, 99)
            } | {"count": len(latencies)},
            "batches": {
                "count": batches,
                "sentences": batch_sentences,
                "mean_size": round(batch_sentences / batches, 3) if batches else None,
                "max_size": int(counters[:, _column("batch_max")].max()),
                "size_histogram": {size_bucket(1 << i): int(n) for i, n in enumerate(buckets) if n},
                "decoding_seconds": round(float(total["decoding_seconds"]), 3),
            },
            "queued_sentences": queued,
        }
