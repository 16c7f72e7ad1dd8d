"""A market error that no status rule names is a logged server error (500), never a silent 400
that blames the caller."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from market.api import errors
from market.errors import InvalidRequestError, MarketError


class _UnmappedError(MarketError):
    """A kind of market error added without a status rule."""


def test_unmapped_market_error_answers_a_logged_500_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    errors.install(app)

    @app.get("/fail")
    def fail() -> None:
        raise _UnmappedError("the secret detail")

    with caplog.at_level(logging.ERROR, logger="market.api"):
        answer = TestClient(app).get("/fail")
    assert answer.status_code == 500
    assert answer.json() == {"error": "_UnmappedError", "detail": "internal error", "problems": []}
    assert "_UnmappedError has no HTTP status" in caplog.text


def test_mapped_market_errors_keep_their_status() -> None:
    assert errors.status_of(InvalidRequestError("bad")) == 422
