"""What a path allows, from every route on it: the ``Allow`` of a 405 and the OPTIONS answer.

The router answers a method a path does not serve with 405, naming only the methods of the
first route on that path (``OPTIONS /v1/orders`` said ``Allow: POST`` though ``GET`` is served
too). This handler names every route's methods, and answers ``OPTIONS`` on a served path with
204 and that list. Every other error goes to the app's own handler (`market.api.errors`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Match

from market.api import errors

METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")
"""The methods any route of the market could serve (each probed against the path)."""


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Return the methods some route of `app` fully matches on the request's path, sorted."""
    return [
        method
        for method in METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in app.router.routes
        )
    ]


async def method_error_handler(request: Request, exc: Exception) -> Response:
    """Answer a 405 naming every method the path serves; OPTIONS with 204 and that list."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = allowed_methods(request.app, request)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": ", ".join([*allowed, "OPTIONS"])})
        exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
    return await errors.http_error_handler(request, exc)


def install(app: FastAPI) -> None:
    """Route the framework's HTTP errors of `app` through `method_error_handler`."""
    app.add_exception_handler(HTTPException, method_error_handler)
