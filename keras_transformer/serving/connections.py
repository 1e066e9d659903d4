"""Connections dealt to the worker processes of `serve --workers N`, each
to the worker that holds the fewest.

Worker processes that share one listening socket race to accept each
connection, and the one whose event loop is free first wins. HTTP clients
keep their connection for their next requests, so a connection's worker
is where its client's sentences are decoded: 32 connections that a client
pool opened one after another went 27 to one worker and 5 to the other
(26 and 6, 22 and 10 in other runs; 20 and 12 for a pool that grew while
its first connections sent requests), and one worker decoded batches
four times the size of the other's.

Here the command's process accepts (`deal`) and hands each connection
over a Unix socket pair (`socket.send_fds`) to the worker that holds the
fewest open connections: those it was given, less those it has closed
(the count each worker keeps in its slot of the shared counters,
`metrics.Metrics.connection_closed`); ties go to the worker given fewer
in all. The worker's thread (`receive`) gives the connection to its event
loop (`loop.connect_accepted_socket`) with uvicorn's HTTP protocol
(`counted_protocol`: the one uvicorn chooses, counting the connections
it opens and closes; uvicorn's own server then answers and shuts it down
as any other). Where Python cannot pass descriptors (`socket.send_fds`,
not on Windows), the workers share the socket.
"""

import logging
import socket
import threading

logger = logging.getLogger("uvicorn.error")

# How often the dealer looks whether the command is stopping (seconds).
ACCEPT_TIMEOUT_SECONDS = 0.2


def can_deal():
    """Whether connections can be dealt (Python passes descriptors)."""
    return hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


def counted_protocol(metrics):
    """Uvicorn's HTTP protocol (httptools where installed, else h11),
    telling `metrics` of each connection it opens and closes; a class for
    `uvicorn.Config(http=...)`."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class CountedProtocol(AutoHTTPProtocol):
        def connection_made(self, transport):
            metrics.connection_opened()
            super().connection_made(transport)

        def connection_lost(self, exc):
            metrics.connection_closed()
            super().connection_lost(exc)

    return CountedProtocol


def deal(listener, backlog, channels, closed, stopping):
    """The command's process: accepts connections on `listener` (queuing
    up to `backlog`, uvicorn's setting) until
    `stopping` (a list, non-empty once the command stops) and sends each to
    the worker of `channels` (its end of each worker's socket pair) that
    holds the fewest; `closed()` gives the connections each worker has
    closed."""
    listener.listen(backlog)
    listener.settimeout(ACCEPT_TIMEOUT_SECONDS)
    given = [0] * len(channels)
    while not stopping:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:  # (closed: the command stops)
            return
        with connection:
            try:
                held = [count - gone for count, gone in zip(given, closed())]
                worker = min(range(len(channels)), key=lambda i: (held[i], given[i]))
                socket.send_fds(channels[worker], [b"c"], [connection.fileno()])
                given[worker] += 1
            except OSError:  # (the worker is gone: the command stops)
                continue
            except Exception:  # noqa: BLE001 - one connection lost, never the dealer
                if stopping:
                    return
                logger.exception("could not hand a connection to a worker")


def start_dealing(listener, backlog, channels, closed, stopping):
    """`deal` in a daemon thread of the command's process."""
    thread = threading.Thread(target=deal, args=(listener, backlog, channels, closed, stopping),
                              name="keras-transformer-dealer", daemon=True)
    thread.start()
    return thread


def receive(channel, loop, protocol_factory):
    """A worker's thread: each connection that arrives on `channel` goes to
    `loop`, served by `protocol_factory()`, until the channel closes."""

    def run():
        while True:
            try:
                _, descriptors, _, _ = socket.recv_fds(channel, 1, 1)
            except OSError:
                return
            if not descriptors:  # (the command's process closed the pair)
                return
            connection = socket.socket(fileno=descriptors[0])
            connection.setblocking(False)
            loop.call_soon_threadsafe(_serve_connection, loop, protocol_factory, connection)

    threading.Thread(target=run, name="keras-transformer-connections", daemon=True).start()


def _serve_connection(loop, protocol_factory, connection):
    loop.create_task(loop.connect_accepted_socket(protocol_factory, connection))
