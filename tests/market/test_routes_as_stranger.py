"""Every route of the market, read from its own OpenAPI document, called by a stranger with
malformed, oversized, nested, wrong-type, out-of-range and zero-signature inputs, against a
real server with and without an escrow to read: never a 5xx, never a crash, never a long error.

The requests are built from the document (path and query parameters, body schemas), so a route
added later is called the same way without touching this test.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from contracts.chain import Anvil

from .chain import deploy_world
from .server import market_process, peak_rss_mb

ZERO_SIGNATURE = "0x" + "00" * 65
SAMPLES_BY_PATTERN = {
    "^0x[0-9a-fA-F]{40}$": "0x" + "11" * 20,
    "^0x[0-9a-fA-F]{130}$": "0x" + "22" * 65,
    "^0x[0-9a-fA-F]{64}$": "0x" + "33" * 32,
    "^[a-z0-9][a-z0-9._-]{0,63}$": "tpu-v5e",
    "^(bid|ask)$": "bid",
    "^[a-z0-9][a-z0-9._-]{0,63}:[0-9]{1,19}$": "tpu-v5e:1",
}
HOSTILE_STRINGS = [
    "",
    "x" * 10_000,
    "../../../../etc/passwd",
    "%00",
    "\x00",
    "'; DROP TABLE orders; --",
    "ümlaut-ß-😀",
    "0x" + "f" * 64,
    "tpu-v5e:" + "9" * 30,
    "-1",
    "9" * 5_000,
]
HOSTILE_NUMBERS: list[Any] = [-1, 2**64, 2**300, -(2**300), 1.5, "1e400", None, True, [], {}]
HOSTILE_QUERY = ["abc", "-1", "0", "1.5", "9" * 30, "9" * 5_000, "", "ümlaut", "1e400", "null"]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module", params=["no-escrow", "escrow"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    data_dir = tmp_path_factory.mktemp(f"stranger-{request.param}") / "data"
    if request.param == "no-escrow":
        with market_process(data_dir) as served:
            yield served
        return
    with Anvil.start(accounts=10) as anvil:
        world = deploy_world(anvil)
        flags = ["--rpc-url", anvil.url, "--escrow", world.escrow.address, "--chain-id", "31337"]
        with market_process(data_dir, *flags) as served:
            yield served


def _resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return _resolve(options[0], document)
    return schema


def _sample(schema: dict[str, Any], document: dict[str, Any]) -> Any:
    """Return a well-typed value of `schema` (patterns from `SAMPLES_BY_PATTERN`)."""
    schema = _resolve(schema, document)
    kind = schema.get("type")
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _sample(sub, document) for name, sub in props.items()}
    if kind == "array":
        return [_sample(schema["items"], document)]
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return False
    if kind == "string" and "pattern" not in schema and "default" in schema:
        return schema["default"]  # a well-formed value where the field has rules (an endpoint)
    return SAMPLES_BY_PATTERN.get(schema.get("pattern", ""), "sample")


def _mutations(sample: Any) -> Iterator[tuple[str, Any]]:
    """Yield (what, body) for each field of `sample` set to each hostile value, a level deep."""
    if not isinstance(sample, dict):
        return
    for name, value in sample.items():
        hostile = HOSTILE_STRINGS if isinstance(value, str) else HOSTILE_NUMBERS
        for bad in hostile:
            yield f"{name}={str(bad)[:20]!r}", {**sample, name: bad}
        if isinstance(value, dict):
            for what, inner in _mutations(value):
                yield f"{name}.{what}", {**sample, name: inner}
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for what, inner in _mutations(value[0]):
                yield f"{name}[0].{what}", {**sample, name: [inner]}
    if "signature" in sample:
        yield "zero signature", {**sample, "signature": ZERO_SIGNATURE}
    yield "extra field", {**sample, "extra": "x"}
    yield "missing all", {}


def _raw_bodies() -> Iterator[tuple[str, bytes, dict[str, str]]]:
    yield "200 KB of brackets", b"[" * 100_000, JSON
    yield "deep object", b'{"a":' * 5_000 + b"1" + b"}" * 5_000, JSON
    yield "60,000 items", json.dumps({"orders": [{"side": "bid"}] * 60_000}).encode(), JSON
    yield "2 MiB string", b'"' + b"x" * (2 << 20) + b'"', JSON
    yield "not JSON", b"{not json", JSON
    yield "invalid UTF-8", b'{"a": "\xff\xfe"}', JSON
    yield "empty", b"", JSON
    yield "array", b"[]", JSON
    yield "number", b"1e400", JSON
    yield "NaN", b'{"price": NaN}', JSON
    yield "text/plain", b"{}", {"content-type": "text/plain"}
    yield "form", b"a=1", {"content-type": "application/x-www-form-urlencoded"}
    yield "no type", b"{}", {}


def _path(template: str, parameters: list[dict[str, Any]], overrides: dict[str, str]) -> str:
    """Fill `template`'s path parameters: well-formed samples unless overridden (quoted)."""
    path = template
    for p in parameters:
        if p["in"] == "path":
            sample = SAMPLES_BY_PATTERN.get(p["schema"].get("pattern", ""), "x")
            value = overrides.get(p["name"], sample)
            path = path.replace("{" + p["name"] + "}", quote(value, safe=""))
    return path


def _check(response: httpx.Response, what: str, failures: list[str]) -> None:
    if response.status_code >= 500:
        failures.append(f"{what}: {response.status_code} {response.text[:200]}")
    elif response.status_code >= 400 and len(response.content) > 16_384:
        failures.append(f"{what}: {response.status_code} with a {len(response.content)}-byte body")


def test_every_route_when_called_by_a_stranger_with_hostile_inputs_then_never_5xx(
    server: tuple[str, int],
) -> None:
    url, pid = server
    client = httpx.Client(base_url=url, timeout=30)
    document = client.get("/openapi.json").json()
    failures: list[str] = []
    calls = 0
    started = time.perf_counter()
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            if template == "/v1/stream":
                with client.stream(method, template) as response:
                    _check(response, template, failures)
                calls += 1
                continue
            requests: list[tuple[str, dict[str, Any]]] = []
            for p in parameters:
                for bad in HOSTILE_STRINGS if p["in"] == "path" else HOSTILE_QUERY:
                    if p["in"] == "path":
                        requests.append(
                            (
                                f"{p['name']}={bad[:20]!r}",
                                {"url": _path(template, parameters, {p["name"]: bad})},
                            )
                        )
                    else:
                        requests.append(
                            (
                                f"?{p['name']}={bad[:20]!r}",
                                {
                                    "url": _path(template, parameters, {}),
                                    "params": {p["name"]: bad},
                                },
                            )
                        )
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                sample = _sample(body["schema"], document)
                plain = _path(template, parameters, {})
                requests.append(("sample", {"url": plain, "json": sample}))
                for what, mutated in _mutations(sample):
                    requests.append(
                        (
                            what,
                            {
                                "url": plain,
                                "content": json.dumps(mutated).encode(),
                                "headers": JSON,
                            },
                        )
                    )
                for what, raw, headers in _raw_bodies():
                    requests.append((what, {"url": plain, "content": raw, "headers": headers}))
            if not requests:
                requests.append(("plain", {"url": _path(template, parameters, {})}))
            for what, kwargs in requests:
                calls += 1
                try:
                    response = client.request(method.upper(), **kwargs)
                except httpx.TransportError as exc:  # a reset: the server failed to answer
                    failures.append(f"{method.upper()} {template} {what}: {exc!r}")
                    continue
                _check(response, f"{method.upper()} {template} {what}", failures)
                if body is not None and "zero signature" in what:
                    assert response.status_code in (401, 404), (template, response.text)
        for other in ("put", "delete", "patch"):
            if other not in operations:
                response = client.request(
                    other.upper(),
                    _path(template, operations[next(iter(operations))].get("parameters", []), {}),
                )
                _check(response, f"{other.upper()} {template}", failures)
                assert response.status_code in (404, 405), (other, template)
                calls += 1
    seconds = time.perf_counter() - started
    assert client.get("/healthz").status_code == 200
    os.kill(pid, 0)  # still running
    print(
        f"{calls} hostile calls over {len(document['paths'])} paths in {seconds:.1f} s; "
        f"peak RSS {peak_rss_mb(pid):.0f} MiB"
    )
    client.close()
    assert not failures, "\n".join(failures[:30])
