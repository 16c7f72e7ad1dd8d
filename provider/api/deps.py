"""Dependencies of the routes: the daemon the app serves."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from provider.daemon import Daemon


def daemon_of(request: Request) -> Daemon:
    """Return the daemon this app serves."""
    daemon: Daemon = request.app.state.daemon
    return daemon


async def get_daemon(request: Request) -> Daemon:
    """Return the daemon this app serves (async: FastAPI runs sync dependencies in a thread)."""
    return daemon_of(request)


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
