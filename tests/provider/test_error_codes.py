"""Every refusal code the provider raises has its HTTP status, and a code without one is a
logged server error (500), never a silent 400 that blames the caller."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from provider.api import errors
from provider.errors import RejectedError

PROVIDER = Path(__file__).resolve().parents[2] / "provider"
RAISERS = {"RejectedError", "reject", "_reject"}


def _raised_codes() -> dict[str, str]:
    """Return each code passed to a refusal in provider/ (a literal, or a module's string
    constant such as ``OUT_OF_RANGE``), with where it is raised."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PROVIDER.rglob("*.py"))}
    constants: dict[str, str] = {}
    for tree in trees.values():
        for statement in tree.body:
            value = getattr(statement, "value", None)
            targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for target in targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = value.value
    codes: dict[str, str] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if isinstance(first, ast.Name):
                code = constants.get(first.id)
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                code = first.value
            else:
                code = None
            if name in RAISERS and code is not None:
                codes.setdefault(code, f"{path.relative_to(PROVIDER.parent)}:{node.lineno}")
    return codes


def test_every_code_the_provider_raises_has_its_http_status() -> None:
    codes = _raised_codes()
    assert len(codes) > 20, codes  # the scan finds the refusals, named by constants too
    assert "task_index_out_of_range" in codes and "counterparty_has_code" in codes
    missing = {code: where for code, where in codes.items() if code not in errors.STATUS_BY_CODE}
    assert not missing, f"codes without an HTTP status in provider/api/errors.py: {missing}"


def test_unknown_code_answers_a_logged_500_with_the_stable_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = FastAPI()
    errors.install(app)

    @app.get("/refuse")
    def refuse() -> None:
        raise RejectedError("code_nobody_mapped", "the secret detail of node http://10.0.0.1:8545")

    with caplog.at_level(logging.ERROR, logger="provider.api"):
        answer = TestClient(app).get("/refuse")
    assert answer.status_code == 500
    assert answer.json() == {"error": "code_nobody_mapped", "reason": "internal error"}
    assert "code_nobody_mapped" in caplog.text and "no HTTP status" in caplog.text


def test_known_codes_keep_their_status() -> None:
    assert errors.render("task_index_used", "used")[0] == 409
    assert errors.render("bad_request", "no")[0] == 400
