"""Serve a team behind an OpenAI-compatible API: the app of
:mod:`marl.orchestrator.serving.app` under uvicorn.

The server binds 127.0.0.1 unless told otherwise; a connection that sends no whole request head
within ``Limits.header_timeout_s`` is closed, one whose body has not all come within
``Limits.body_timeout_s`` gets a 408 and is closed (:mod:`.guard`, which also answers 503
beyond ``Limits.max_requests`` requests at once, ``/health`` excepted: uvicorn's own
concurrency limit would refuse the health check too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from marl.orchestrator.serving.api import Limits, game_of
from marl.orchestrator.serving.app import create_app
from marl.orchestrator.serving.batcher import TeamBatcher
from marl.orchestrator.team import Team

log = logging.getLogger(__name__)


class _H11WithHeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    within ``header_timeout_s`` (uvicorn times out idle kept-alive connections only)."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)


class ServeError(Exception):
    """The server cannot start: its address is taken or not this machine's."""


#: Hosts only this machine reaches; any other is served with a warning unless a key guards it.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class TeamServer:
    """uvicorn serving :func:`create_app` on a socket bound at construction (so ``port=0``
    has its port, and a taken address fails here); ``url`` is the OpenAI ``base_url``."""

    def __init__(
        self,
        team: Team,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        limits: Limits = Limits(),
        **app_kwargs: Any,
    ) -> None:
        self.app = create_app(team, limits=limits, **app_kwargs)
        self.limits = limits
        self.batcher: TeamBatcher = self.app.state.batcher
        self.model_id: str = self.app.state.model_id
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(2048)
        except OSError:
            self.socket.close()
            self.batcher.close()
            raise
        self.server_address = self.socket.getsockname()
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                http=functools.partial(
                    _H11WithHeaderTimeout, header_timeout_s=limits.header_timeout_s
                ),
                timeout_keep_alive=limits.keep_alive_s,
                h11_max_incomplete_event_size=limits.max_header_bytes,
                timeout_graceful_shutdown=5,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        """Serve on this thread until SIGINT/SIGTERM (uvicorn's handlers), then shut down."""
        self.server.run(sockets=[self.socket])

    def start(self) -> None:
        """Serve on a background thread (tests, notebooks); stop with :meth:`stop`."""
        self._thread = threading.Thread(target=self.serve_forever, name="team-server", daemon=True)
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.socket.close()
        self.batcher.close()

    def __enter__(self) -> TeamServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(team: Team, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> TeamServer:
    """A bound (not yet serving) server; ``port=0`` picks a free port (see ``.url``)."""
    return TeamServer(team, host, port, **kwargs)


def open_server(team: Team, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> TeamServer:
    """:func:`make_server`, an address it cannot bind raised as :class:`ServeError`."""
    try:
        return make_server(team, host, port, **kwargs)
    except OSError as exc:
        raise ServeError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to warn of when a host other machines reach is served without ``api_key``."""
    if host in LOOPBACK or api_key is not None:
        return None
    return f"serving on {host} without an API key: whoever reaches it can run the team"


def ready_line(server: TeamServer, team: Team) -> str:
    """The one line that says where the team is served (``marl serve`` prints it on stdout, so
    a parent process can read it)."""
    return f"serving team {team.name!r} on {server.url} (model {server.model_id!r}); Ctrl-C to stop"


def game_warning(team: Team) -> str | None:
    """What to warn of when the team served was made to play a game."""
    game = game_of(team)
    if game is None:
        return None
    return (
        f"team {team.name!r} was made to play {game}; served, its agents answer chat messages "
        "in free text, which they were not trained for (its answers say X-Marl-Game-Team)"
    )


def raise_open_files(limits: Limits) -> None:
    """Raise this process's soft open-file limit (up to the hard one) so ``max_requests``
    connections and the process's own files fit: past it, the server cannot accept a
    connection, not even a health check's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_requests + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (want if hard == resource.RLIM_INFINITY else min(want, hard), hard),
        )


def run_until_interrupted(server: TeamServer) -> None:
    """Serve until Ctrl-C or SIGTERM (with the open files its limits need), then shut
    down."""
    raise_open_files(server.limits)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # uvicorn shut down, then raised the signal again
        pass
    finally:
        server.stop()


def serve(
    team: Team,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    **kwargs: Any,
) -> None:
    """Serve until Ctrl-C, logging the URL once bound and a warning when a non-loopback host
    is open without ``api_key``."""
    server = open_server(team, host, port, api_key=api_key, **kwargs)
    for warning in (exposure_warning(host, api_key), game_warning(team)):
        if warning is not None:
            log.warning(warning)
    log.info(ready_line(server, team))
    run_until_interrupted(server)
