"""`keras-transformer serve --workers N`: N worker processes serving on
one address.

A process decodes one batch at a time: between two batches its decoding
thread waits while its event loop answers the requests of the first and
reads those of the next (on 2 CPU cores, 32 clients, the shipped preset's
first model, greedy: 12-17 ms between batches of 90-110 ms, the event loop
writing and reading sockets for most of it), and its threads share one
interpreter lock. Worker processes, each with its own models, decoding
thread and event loop, take turns on the cores: one decodes while another
answers. Each computes with its share of the cores (`OMP_NUM_THREADS` and
`TF_NUM_INTRAOP_THREADS`, unless set).

The command's process binds the socket, starts the workers (each a fresh
interpreter, through `multiprocessing`'s spawn), deals each connection to
the worker that holds the fewest (`connections.py`; where descriptors
cannot be passed, the workers share the socket and the operating system
gives each connection to one of them), logs the line that names the
address once every worker serves, and on SIGTERM or Ctrl-C stops them,
each answering the requests it holds first. A worker that fails to start, or stops while
serving, stops them all, with its error and exit status 1. The counters
of `GET /metrics` are every worker's (`metrics.CounterSlots` in shared
memory), and `GET /health` fails once any worker's decoding thread
stopped.
"""

import contextlib
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time

logger = logging.getLogger("uvicorn.error")

# How often the command's process looks at its workers (seconds).
POLL_SECONDS = 0.2


def run(args):
    """Serves from `args.workers` worker processes until SIGTERM or Ctrl-C;
    the exit status (0 once every worker shut down as asked)."""
    import multiprocessing

    import uvicorn

    from keras_transformer.serving import connections
    from keras_transformer.serving.command import log_address
    from keras_transformer.serving.metrics import CounterSlots

    config = uvicorn.Config(app=None, host=args.host, port=args.port, log_level="info")
    sock = config.bind_socket()
    slots = CounterSlots.create(args.workers)
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    # (each worker's socket pair: the command's end, the worker's end)
    pairs = [socket.socketpair() for _ in range(args.workers)] if connections.can_deal() else []
    processes = [
        context.Process(target=serve_worker, args=(args, pairs[slot][1] if pairs else sock, slot, slots.name,
                                                   messages, bool(pairs)),
                        name=f"keras-transformer-worker-{slot}")
        for slot in range(args.workers)
    ]
    stopping = []

    def stop(*_):
        if not stopping:
            stopping.append(True)
            for process in processes:
                if process.pid is not None and process.is_alive():
                    os.kill(process.pid, signal.SIGTERM)

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _terminal_as_stderr():
            for process in processes:
                process.start()
        served = _until_every_worker_serves(processes, messages, stopping)
        if served is None:
            status = 1
        else:
            if pairs:
                connections.start_dealing(sock, config.backlog, [own for own, _ in pairs], lambda: slots.counts(
                    "connections_closed"), stopping)
            if not stopping:
                log_address(served, sock, len(processes))
            status = _until_they_stop(processes, stopping)
    finally:
        stop()
        for process in processes:
            if process.pid is not None:
                process.join()
        for number, handler in previous.items():
            signal.signal(number, handler)
        slots.unlink()
        sock.close()
        for pair in pairs:
            for end in pair:
                end.close()
    return status


@contextlib.contextmanager
def _terminal_as_stderr():
    """The process's standard error (file descriptor 2) where Python writes
    its own (`sys.stderr`), while the workers start: they inherit it. The
    command's process sends its native libraries' lines to the null
    device, keeping a copy of the terminal for Python's
    (`utils.native_logs`); each worker does so again."""
    try:
        own = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        own = 2
    if own == 2:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(own, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _until_every_worker_serves(processes, messages, stopping):
    """The pairs that the workers serve, once each of them serves; None
    where one failed (its error printed) or stopped first."""
    ready = {}
    while len(ready) < len(processes):
        try:
            kind, slot, what = messages.get(timeout=POLL_SECONDS)
        except queue.Empty:
            gone = [process for process in processes if process.exitcode is not None]
            if gone and not stopping:
                print(f"error: worker process {processes.index(gone[0])} stopped (exit status {gone[0].exitcode}) "
                      "before it served", file=sys.stderr, flush=True)
                return None
            if stopping:
                return []
            continue
        if kind == "failed":
            print(f"error: {what}", file=sys.stderr, flush=True)
            return None
        ready[slot] = what
    return ready[0]


def _until_they_stop(processes, stopping):
    """Waits until the workers stop: 0 where they were asked to and each
    ended well; 1 (the others stopped) where one ended on its own."""
    while True:
        for process in processes:
            process.join(POLL_SECONDS / len(processes))
            if process.exitcode is None:
                continue
            if not stopping:
                logger.error("worker process %d stopped (exit status %s): stopping the others",
                             processes.index(process), process.exitcode)
                return 1
            for other in processes:
                other.join()
            return 0 if all(other.exitcode == 0 for other in processes) else 1


def serve_worker(args, sock, slot, slots_name, messages, dealt=False):
    """A worker process: prepares itself as the command's process does,
    loads the presets and serves on `sock` (a listening socket, or, where
    `dealt`, its end of the socket pair that its connections arrive on),
    counting into its `slot` of the shared counters; says on `messages`
    when it serves, or why it could not."""
    # (Ctrl-C in a terminal signals the command's process alone, which
    # stops every worker once: a second signal would make uvicorn drop the
    # requests in flight.)
    os.setpgrp()
    _stop_when_orphaned()
    threads = str(max(1, (os.cpu_count() or 1) // args.workers))
    for variable in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(variable, threads)
    from keras_transformer import command_process
    from keras_transformer.serving.command import preset_names
    from keras_transformer.serving.command import serve_here
    from keras_transformer.serving.metrics import CounterSlots
    from keras_transformer.serving.metrics import Metrics

    command_process.prepare("serve")  # (what the command's process does; a fresh interpreter runs this one)
    command_process.leave_out_tensorflow(preset_names(args))
    try:
        metrics = Metrics(CounterSlots.attach(slots_name, slot))
        ready = lambda registry: messages.put(("ready", slot, registry.pairs))  # noqa: E731
        if dealt:
            serve_here(args, metrics, channel=sock, ready=ready)
        else:
            serve_here(args, metrics, sockets=[sock], ready=ready)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - told to the command's process, which prints it
        message = str(error).removeprefix("error: ") or type(error).__name__
        messages.put(("failed", slot, message))
        raise SystemExit(1) from None


def _stop_when_orphaned():
    """A thread that stops this worker (SIGTERM: it answers what it holds)
    once the command's process is gone (killed, say, with no chance to stop
    its workers): a worker is not left serving alone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="keras-transformer-parent-watch", daemon=True).start()
