"""Dynamic batching: sentences of requests that arrive together are
decoded together.

One thread owns the models (they are not thread-safe, and Keras keeps
some state per thread): it loads them, then takes the queued sentences of
one route (model and languages), waits a few milliseconds for more while
they keep coming and the batch is under its token budget, and longer
while the clients that the last batch answered are coming back with their
next sentences (up to a share of that batch's decoding time; once all
of them are back, where their connections tell them apart, at once),
calls `generate` once for all of them, and hands each request its
translations through its event loop (`loop.call_soon_threadsafe`). While it decodes,
new requests queue, so that under load each batch holds what arrived
during the last one.

A request whose client left is dropped from the queue; a batch that fails
is decoded again request by request, so that one bad request fails alone;
`close` decodes what is queued, then stops the thread.
"""

import logging
import threading
import time
from collections import deque

logger = logging.getLogger("keras_transformer.serving")

# A batch's token budget, and how long a batch waits for another sentence
# (the command's --max-batch-tokens and --batch-wait-ms).
DEFAULT_MAX_BATCH_TOKENS = 4096
DEFAULT_BATCH_WAIT_SECONDS = 0.005
# A batch waits for more sentences while they keep coming, at most this
# many times the wait in all.
MAX_WAITS = 10
# While fewer requests are queued than the last batch answered, their
# clients are still coming back: a batch waits for them up to this share
# of the last batch's decoding time, and at most this many seconds. A
# straggler that misses a batch costs a batch of its own, which decodes
# far fewer sentences a second than a full one; 32 clients on a busy
# 2-core machine left 2-3 of 32 behind at every batch with the short wait
# alone.
RETURN_WAIT_SHARE = 0.25
MAX_RETURN_WAIT_SECONDS = 0.2


def estimate_tokens(text):
    """About the number of subword tokens of `text` (with its start and end
    tokens): one a 4 bytes of UTF-8, as the budget counts them; of a pair
    of texts (a sentence and its translation, aligned), both.

    >>> estimate_tokens("A man is riding a bicycle.")
    8
    """
    if isinstance(text, tuple):
        return sum(map(estimate_tokens, text))
    return 2 + len(text.encode("utf-8")) // 4


class Job:
    """One request's sentences on their way through the queue.

    Args:
        route: where they go (`registry.Route`: `key`, `generate`, and
            `counted`: whether its batches count as translations'
            in the metrics).
        texts: the sentences (strings).
        deliver: called once, from the decoding thread, with the list of
            translations or with the exception that failed them.
        client: what tells the request's client from others (its
            connection's address: a client that keeps its connection
            sends its next request on it), or None.
    """

    def __init__(self, route, texts, deliver, client=None):
        self.route = route
        self.client = client
        self.texts = list(texts)
        self.tokens = [estimate_tokens(text) for text in self.texts]
        self.results = [None] * len(self.texts)
        self.remaining = len(self.texts)
        self.deliver = deliver
        self.done = False  # answered, failed, or given up by its client
        self.queued_at = time.monotonic()


class Batcher:
    """The decoding thread and its queue.

    Args:
        metrics: a `metrics.Metrics` told of each batch.
        max_batch_tokens: a batch holds sentences of one route while
            (sentences) x (the longest's estimated tokens) stays within
            this (a longer sentence goes alone).
        batch_wait: seconds a batch waits for another sentence to join it
            (from the later of its first sentence's arrival, the end of the
            last batch and the last arrival; so that the clients the last
            batch answered join with their next sentences), at most
            `MAX_WAITS` times this in all; while fewer requests are
            queued than the last batch answered, up to
            `RETURN_WAIT_SHARE` of that batch's decoding time (at most
            `MAX_RETURN_WAIT_SECONDS`). Where the jobs name their clients
            (`Job.client`) and every client the last batch answered is
            back, the batch starts at once.
    """

    def __init__(self, metrics, max_batch_tokens=DEFAULT_MAX_BATCH_TOKENS, batch_wait=DEFAULT_BATCH_WAIT_SECONDS):
        self.metrics = metrics
        self.max_batch_tokens = max_batch_tokens
        self.batch_wait = batch_wait
        self._items = deque()  # (job, index of a sentence)
        self._condition = threading.Condition()
        self._closing = False
        self._thread = None
        self._last_batch_end = float("-inf")
        self._last_arrival = float("-inf")
        self._last_batch_requests = 0  # requests the last batch answered
        self._last_batch_clients = frozenset()  # their clients, where every one is known
        self._last_batch_seconds = 0.0

    def start(self, load=None):
        """Starts the decoding thread; it first runs `load()` (the models
        loaded and warmed in the thread that decodes), whose result this
        returns once it is done, or whose exception it raises."""
        ready = threading.Event()
        outcome = {}

        def run():
            try:
                outcome["value"] = load() if load is not None else None
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                outcome["error"] = error
                ready.set()
                return
            ready.set()
            self._serve()

        self._thread = threading.Thread(target=run, name="keras-transformer-decoding", daemon=True)
        self._thread.start()
        while not ready.wait(0.2):  # a short wait, so that Ctrl-C interrupts loading
            pass
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def submit(self, job):
        """Queues a job's sentences (refused once `close` began)."""
        with self._condition:
            if self._closing:
                raise RuntimeError("the server is shutting down")
            self._items.extend((job, index) for index in range(len(job.texts)))
            self._last_arrival = job.queued_at
            self._condition.notify()

    def cancel(self, job):
        """Gives up a job (its client left): its sentences not yet decoding
        leave the queue."""
        with self._condition:
            job.done = True
            self._items = deque(item for item in self._items if item[0] is not job)

    def queued(self):
        """The number of sentences waiting."""
        with self._condition:
            return len(self._items)

    def close(self, timeout=None):
        """Decodes what is queued, then stops the thread."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self):
        """Whether the decoding thread runs (`GET /health`)."""
        return self._thread is not None and self._thread.is_alive()

    def _serve(self):
        batch = []
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                if batch:  # (empty when the jobs it held were given up while it waited)
                    self._decode(batch)
        except BaseException as error:  # noqa: BLE001 - the thread's end: no request is left waiting
            logger.critical("the decoding thread stopped", exc_info=error)
            self.metrics.decoding_stopped()
            with self._condition:
                self._closing = True
                jobs = _jobs_of([*(batch or ()), *self._items])
            for job in jobs:
                self._finish(job, RuntimeError(f"the decoding thread stopped ({type(error).__name__}: {error})"))

    def _next_batch(self):
        """The next batch: queued sentences of the first one's route, up to
        the token budget, once the budget is full, no sentence has come for
        `batch_wait`, the batch has waited `MAX_WAITS` x `batch_wait` (or,
        while the last batch's clients are coming back, its return wait),
        or the server is closing. None to stop."""
        with self._condition:
            while not self._items:
                if self._closing:
                    return None
                self._condition.wait()
            first = self._items[0][0]
            # From the later of its arrival and the last batch's end: the
            # clients that batch answered come back with their next
            # sentences within milliseconds, and join this batch while
            # they keep coming.
            opened = max(first.queued_at, self._last_batch_end)
            returning = min(RETURN_WAIT_SHARE * self._last_batch_seconds, MAX_RETURN_WAIT_SECONDS)
            while not self._closing:
                batch, full = self._take(first.route.key, remove=False)
                deadline = min(opened + MAX_WAITS * self.batch_wait,
                               max(opened, self._last_arrival) + self.batch_wait)
                # Requests that came since the last batch ended: those of
                # the clients it answered (the others had queued while it
                # decoded: counting them, two halves of the clients would
                # take turns in batches of half the size).
                came = [job for job, _ in batch if job.queued_at >= self._last_batch_end]
                if len({id(job) for job in came}) < self._last_batch_requests:
                    deadline = max(deadline, opened + returning)
                # Every client the last batch answered is back: nobody else
                # is on the way (the short wait is for a burst of others).
                back = self._last_batch_clients and self._last_batch_clients <= {job.client for job in came}
                left = deadline - time.monotonic()
                if full or left <= 0 or back:
                    break
                self._condition.wait(left)
            return self._take(first.route.key, remove=True)[0]

    def _take(self, key, remove):
        """The queued sentences of `key` that fit the budget, in order, and
        whether the budget is full; with `remove`, taken off the queue."""
        batch, kept, longest, full = [], deque(), 0, False
        for job, index in self._items:
            if job.done:
                continue
            tokens = max(longest, job.tokens[index])
            fits = not batch or (len(batch) + 1) * tokens <= self.max_batch_tokens
            if job.route.key == key and fits and not full:
                batch.append((job, index))
                longest = tokens
            else:
                full = full or job.route.key == key
                kept.append((job, index))
        if remove:
            self._items = kept
        return batch, full

    def _decode(self, batch):
        """Decodes `batch` ((job, index) pairs of one route) with one
        `generate`; a failure is retried job by job, so that it fails only
        the job that causes it."""
        started = time.monotonic()
        try:
            outputs = batch[0][0].route.generate([job.texts[index] for job, index in batch])
        except Exception as error:  # noqa: BLE001 - reported to the requests, never the end of the thread
            jobs = _jobs_of(batch)
            if len(jobs) > 1:
                for job in jobs:
                    self._decode([(j, index) for j, index in batch if j is job])
                return
            self._finish(jobs[0], error)
            return
        self._last_batch_end = time.monotonic()
        self._last_batch_seconds = self._last_batch_end - started
        if batch[0][0].route.counted:  # (not a batch of alignments)
            self.metrics.batch_decoded(len(batch), self._last_batch_seconds)
        for (job, index), output in zip(batch, outputs):
            job.results[index] = output
            job.remaining -= 1
            if job.remaining == 0:
                self._finish(job, job.results)
        # (their clients may send their next sentences at once)
        answered = [job for job in _jobs_of(batch) if job.remaining == 0]
        self._last_batch_requests = len(answered)
        clients = {job.client for job in answered}
        self._last_batch_clients = frozenset(clients) if None not in clients else frozenset()

    def _finish(self, job, outcome):
        with self._condition:
            if job.done:
                return
            job.done = True
            self._items = deque(item for item in self._items if item[0] is not job)
        try:
            job.deliver(outcome)
        except Exception:  # noqa: BLE001 - the request's loop is gone (shutdown): nothing to tell
            logger.debug("could not deliver a result", exc_info=True)


def _jobs_of(items):
    """The jobs of `(job, index)` items, each once, in order."""
    return list({id(job): job for job, _ in items}.values())
