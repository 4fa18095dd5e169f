"""Running the edge: uvicorn with the edge's settings and a bounded graceful shutdown.

Streams never end on their own, so without a bound a SIGTERM would wait for every client
to hang up; after ``shutdown_grace_s`` the open streams are closed (resumable clients
reconnect to another edge with ``Last-Event-ID``; non-resumable requests are cancelled).
uvicorn picks uvloop and httptools when they are installed (faster relay, see bench.py).
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from uvicorn.server import STARTUP_FAILURE

from services.edge.app import create_app
from services.edge.config import EdgeSettings


def serve(settings: EdgeSettings) -> None:
    """Serve until SIGTERM/SIGINT (what ``tokenwire edge`` runs). The app sees the server
    (``app.state.server``), so a stop asked while it starts ends the start."""
    app = create_app(settings)
    server = uvicorn.Server(server_config(app, settings))
    app.state.server = server
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # as uvicorn.run ends a server that never started


def server_config(app: Any, settings: EdgeSettings) -> uvicorn.Config:
    """uvicorn's settings for the edge. uvicorn's own loggers (a request's unhandled
    exception among them) go to the service's JSON log, not to handlers of their own."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level="warning",
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        access_log=False,
        # A WebSocket message has the HTTP body limit (uvicorn's default is 16 MiB): a
        # larger one closes the socket with 1009, message too big.
        ws_max_size=settings.max_body_bytes,
    )
