"""A market server keeps what it built at start-up out of the garbage collector's scans
(`market.heap`); an app built in a test process leaves that process's collector alone."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.market.server import market_server

FROZEN = re.compile(r"^market_heap_frozen_objects (\S+)$", re.MULTILINE)


def _frozen(metrics: str) -> float:
    found = FROZEN.search(metrics)
    assert found is not None, metrics[:2000]
    return float(found.group(1))


def test_a_served_market_freezes_its_start_up_heap(tmp_path: Path) -> None:
    with market_server(tmp_path / "data") as url:
        # The imports alone are well over 100k tracked objects; moved out once, at start.
        assert _frozen(httpx.get(url + "/metrics", timeout=10).text) > 100_000
        assert (
            httpx.get(url + "/v1/book", params={"device_class": "cpu"}, timeout=10).status_code
            < 500
        )


def test_an_app_built_in_a_test_process_leaves_its_collector_alone(client: TestClient) -> None:
    before = gc.get_freeze_count()
    assert _frozen(client.get("/metrics").text) == 0
    assert gc.get_freeze_count() == before
