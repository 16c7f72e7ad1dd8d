"""Uploads bounded by the task's price and the deal's storage bound, on the daemon served by
its CLI (real uvicorn, real sockets, anvil): a refusal comes before the body is read and
before any ack, with a 4xx and its reason."""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.messages import Voucher, task_bitmap
from programs.envelope import encode_envelope
from provider.config_storage import StorageConfig
from provider.errors import RejectedError
from provider.storage_bounds import StorageBounds
from tests.provider.daemon_support import (
    ChainWorld,
    ServedDaemon,
    served_daemon,
    sign_task,
    tiny_mlp_envelope,
)
from tests.provider.test_storage_retention import acknowledge, deliver, envelope, open_journal

UPLOAD_BASE = 65_536  # every task here may upload 64 KiB: its price buys no more


@pytest.fixture(scope="module")
def body_size() -> int:
    envelope, _ = tiny_mlp_envelope()
    size = len(encode_envelope(envelope))
    assert size < UPLOAD_BASE
    return size


@pytest.fixture(scope="module")
def served(
    chain_world: ChainWorld, tmp_path_factory: pytest.TempPathFactory, body_size: int
) -> Iterator[tuple[ServedDaemon, Path]]:
    # a deal may hold two tasks' uploads and outputs, not three
    settings = (
        "\n[storage]\n"
        f"upload_base_bytes = {UPLOAD_BASE}\n"
        "upload_bytes_per_unit = 0\n"
        f"deal_max_bytes = {body_size * 5 // 2}\n"
    )
    work = tmp_path_factory.mktemp("storage-bounds")
    with served_daemon(chain_world, work, settings=settings) as daemon:
        yield daemon, work / "data" / "journal.sqlite3"


def acks_of(journal: Path, deal_id: int) -> list[int]:
    """Read the daemon's journal (read-only, beside it): the acked task indexes of a deal."""
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT task_index FROM acks WHERE deal_id = ? ORDER BY task_index", (str(deal_id),)
        )
        return [int(r[0]) for r in rows]
    finally:
        db.close()


def test_upload_when_declared_above_what_its_price_allows_then_413_before_any_byte_is_read(
    chain_world: ChainWorld, served: tuple[ServedDaemon, Path]
) -> None:
    daemon, journal = served
    deal_id = chain_world.open_deal()
    envelope, _ = tiny_mlp_envelope()
    task = sign_task(chain_world, chain_world.client, deal_id, 0, envelope)
    head = "".join(f"{k}: {v}\r\n" for k, v in task.headers().items())
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sock.sendall(
            (
                "POST /v1/tasks HTTP/1.1\r\nhost: daemon\r\n"
                f"{head}content-length: 200000000\r\n\r\n"
            ).encode()
        )  # 200 MB declared, none sent: the answer comes without the body
        sock.settimeout(120)  # a guard against a daemon that waits for the body
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4_096)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert status == 413 and body["error"] == "envelope_too_large", answer
    assert f"may upload at most {UPLOAD_BASE} bytes" in body["reason"]
    assert acks_of(journal, deal_id) == []


def test_upload_when_streamed_past_its_cap_then_413_and_nothing_acked(
    chain_world: ChainWorld, served: tuple[ServedDaemon, Path]
) -> None:
    daemon, journal = served
    deal_id = chain_world.open_deal()
    envelope, _ = tiny_mlp_envelope()
    task = sign_task(chain_world, chain_world.client, deal_id, 0, envelope)

    def chunks() -> Iterator[bytes]:  # no declared length: the cap applies as it streams
        yield task.body
        for _ in range(64):
            yield b"\x00" * 16_384

    reply = httpx.post(daemon.url + "/v1/tasks", headers=task.headers(), content=chunks())
    assert reply.status_code == 413 and reply.json()["error"] == "envelope_too_large"
    assert acks_of(journal, deal_id) == []


def test_deal_when_its_storage_bound_is_reached_then_new_tasks_are_refused_before_the_ack(
    chain_world: ChainWorld, served: tuple[ServedDaemon, Path]
) -> None:
    daemon, journal = served
    deal_id = chain_world.open_deal()
    envelope, _ = tiny_mlp_envelope()
    for index in (0, 1):
        task = sign_task(chain_world, chain_world.client, deal_id, index, envelope)
        accepted = httpx.post(daemon.url + "/v1/tasks", headers=task.headers(), content=task.body)
        assert accepted.status_code == 200, accepted.text
    task = sign_task(chain_world, chain_world.client, deal_id, 2, envelope)
    refused = httpx.post(daemon.url + "/v1/tasks", headers=task.headers(), content=task.body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "deal_storage_full"
    assert "storage.deal_max_bytes" in refused.json()["reason"]
    assert acks_of(journal, deal_id) == [0, 1]  # refused before its ack
    # the bound is the deal's: another deal of the same client is served
    other = chain_world.open_deal()
    task = sign_task(chain_world, chain_world.client, other, 0, envelope)
    served_other = httpx.post(daemon.url + "/v1/tasks", headers=task.headers(), content=task.body)
    assert served_other.status_code == 200, served_other.text
    assert acks_of(journal, other) == [0]


def test_deal_bound_when_its_tasks_are_settled_then_their_room_is_free_again(
    tmp_path: Path,
) -> None:
    journal = open_journal(tmp_path / "journal.sqlite3")
    try:
        size = len(envelope(1, 0))
        per_unit = -(-size // 500)  # a task priced 500 may upload its body, one priced 1 not
        config = StorageConfig(
            deal_max_bytes=3 * size, upload_base_bytes=0, upload_bytes_per_unit=per_unit
        )
        bounds = StorageBounds(journal, config, max_envelope_bytes=10**9)
        assert bounds.upload_cap(500) >= size
        for price, declared in ((1, size), (500, bounds.upload_cap(500) + 1)):
            with pytest.raises(RejectedError) as too_large, bounds.admit((1, 0), price, declared):
                pass
            assert too_large.value.code == "envelope_too_large"
        for index in (0, 1):
            with bounds.admit((1, index), price=500, declared=size):
                record = acknowledge(journal, 1, index, envelope(1, index))
            deliver(journal, record, b"o" * size)  # outputs count too
        with pytest.raises(RejectedError) as full, bounds.admit((1, 2), 500, size):
            pass
        assert full.value.code == "deal_storage_full"
        with bounds.admit((2, 0), 500, size) as cap:  # the bound is per deal
            assert cap == size

        voucher = journal.record_voucher(Voucher(1, 1_000, task_bitmap([0, 1])), b"\x00" * 65)
        journal.record_settlement(1, "redeem", {"voucher_seq": voucher.seq}, "0x01")  # prunes
        assert journal.stored_bytes(1) == 0
        with bounds.admit((1, 2), 500, size) as cap:
            assert cap == size
    finally:
        journal.close()
