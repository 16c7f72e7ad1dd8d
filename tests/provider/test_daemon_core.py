"""Pure parts of the daemon and its journal: no chain, no workers."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from client.market_http import MarketHttp, MarketHttpError
from contracts.messages import (
    KIND_COMPILE,
    KIND_INFERENCE,
    ZERO_HASH,
    Ack,
    Domain,
    Plan,
    Receipt,
    TaskRequest,
    Voucher,
    address_of,
    task_bitmap,
)
from contracts.orders import market_domain
from contracts.pricing import flat, metered, price_receipt
from programs.envelope import (
    ProducerVersions,
    ProgramEnvelope,
    ProgramFormatError,
    compile_input_hash,
    encode_envelope,
    request_input_hash,
)
from provider.api import create_app
from provider.config import AskConfig, SettlementConfig, load_config, to_address
from provider.daemon import Daemon
from provider.errors import ConfigError, JournalCorruptError, JournalError
from provider.heartbeat import Heartbeat, build_advert, heartbeat_message, signed_heartbeat
from provider.journal import SCHEMA_VERSION, AckRecord, Journal
from provider.metrics import ProviderMetrics
from provider.receipts import ack_price, build_receipt, settle_by, voucher_tasks
from provider.sandbox import Sandbox
from tests.provider.daemon_support import (
    PENALTY,
    ChainWorld,
    provider_config,
    sign_task,
    start_world,
    tiny_mlp_envelope,
    wait_until,
)

KEY = "0x" + "11" * 32
DOMAIN = Domain(chain_id=31337, verifying_contract="0x" + "22" * 20)
PLAN = flat(compile_price=1_000, inference_price=500)


def request(index: int, kind: int = KIND_INFERENCE, max_price: int = 900) -> TaskRequest:
    return TaskRequest(
        deal_id=7,
        task_index=index,
        kind=kind,
        program_hash=b"\x01" * 32,
        input_hash=b"\x02" * 32,
        max_price=max_price,
        deadline=1_000,
    )


# ---- binding a compile target ------------------------------------------------------------


def envelope() -> ProgramEnvelope:
    return ProgramEnvelope.create(
        program=b"blob",
        inputs=b"inputs",
        producer=ProducerVersions(jax="0.10.2", jaxlib="0.10.2", calling_convention=9),
        platforms=("cpu",),
    )


def test_request_input_hash_when_inference_then_plain_inputs_hash() -> None:
    env = envelope()
    assert request_input_hash(KIND_INFERENCE, env) == env.inputs_sha256


def test_request_input_hash_when_compile_then_bound_to_the_exact_target() -> None:
    env = envelope()
    local = request_input_hash(KIND_COMPILE, env, "local")
    expected = hashlib.sha256(
        b"tpumarket.compile-target.v1" + bytes([5]) + b"local" + env.inputs_sha256
    ).digest()
    assert local == expected == compile_input_hash("local", env.inputs_sha256)
    assert local != request_input_hash(KIND_COMPILE, env, "v5e:1x1")
    assert local != env.inputs_sha256


@pytest.mark.parametrize("target", ["", "v5e 1x1", "x" * 65, "tpu\n"])
def test_compile_input_hash_when_target_is_odd_then_rejected(target: str) -> None:
    with pytest.raises(ProgramFormatError):
        compile_input_hash(target, b"\x00" * 32)


def test_request_input_hash_when_target_missing_or_superfluous_then_rejected() -> None:
    with pytest.raises(ProgramFormatError):
        request_input_hash(KIND_COMPILE, envelope())
    with pytest.raises(ProgramFormatError):
        request_input_hash(KIND_INFERENCE, envelope(), "local")


@given(
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=64)
)
def test_compile_input_hash_is_injective_in_the_target(target: str) -> None:
    assert compile_input_hash(target, b"\x00" * 32) != compile_input_hash(
        target + "x" if len(target) < 64 else target[:-1], b"\x00" * 32
    )


# ---- pricing and receipts ----------------------------------------------------------------


def test_ack_price_when_flat_plan_then_flat_price_else_max_price() -> None:
    assert ack_price(PLAN, request(0)) == 500
    assert ack_price(PLAN, request(0, KIND_COMPILE)) == 1_000
    assert ack_price(metered(3), request(0, max_price=777)) == 777


@given(
    st.integers(0, 10_000),
    st.sampled_from([KIND_COMPILE, KIND_INFERENCE]),
    st.integers(0, 10),
    st.booleans(),
)
def test_build_receipt_amount_equals_plan_price(
    device_ms: int, kind: int, status: int, cache_hit: bool
) -> None:
    plan = Plan(
        compile_price=900, inference_price=300, price_per_device_ms=2, cache_hit_discount_bps=5000
    )
    receipt = build_receipt(
        plan,
        request(3, kind),
        deadline=100,
        outputs=b"out",
        status=status,
        device_ms=device_ms,
        compile_ms=5,
        cache_hit=cache_hit,
        started_at=90,
        finished_at=95,
        prev_receipt_hash=ZERO_HASH,
    )
    assert receipt.amount == price_receipt(plan, receipt)
    assert receipt.output_hash == hashlib.sha256(b"out").digest()
    assert receipt.device_ms == (0 if kind == KIND_COMPILE else device_ms)


@given(st.sets(st.integers(0, 2_000), max_size=40))
def test_voucher_tasks_inverts_task_bitmap(tasks: set[int]) -> None:
    voucher = Voucher(deal_id=1, cumulative_amount=0, tasks=task_bitmap(tasks))
    assert voucher_tasks(voucher) == sorted(tasks)


# ---- journal -----------------------------------------------------------------------------


def ack_record(index: int) -> AckRecord:
    req = request(index)
    ack = Ack(deal_id=7, task_index=index, request_hash=req.struct_hash(), price=500)
    return AckRecord(
        request=req,
        request_sig=b"\x00" * 65,
        request_hash=req.struct_hash(),
        target=None,
        ack=ack,
        ack_sig=ack.sign(DOMAIN, KEY),
        acked_at=float(index),
    )


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", address_of(KEY), DOMAIN)
    try:
        yield j
    finally:
        j.close()


def deliver(journal: Journal, index: int, *, defer: bool = False, ack: bool = True) -> bytes:
    record = ack_record(index)
    if ack:
        journal.record_ack(record, b"envelope-%d" % index, defer=defer)
    with journal.lock:
        receipt = build_receipt(
            PLAN,
            record.request,
            deadline=record.request.deadline,
            outputs=b"o",
            status=0,
            device_ms=1,
            compile_ms=0,
            cache_hit=False,
            started_at=1,
            finished_at=2,
            prev_receipt_hash=journal.next_prev_hash(7),
        )
        journal.record_receipt(receipt, receipt.sign(DOMAIN, KEY), b"o", {"state": "succeeded"})
    return receipt.struct_hash()


def test_journal_when_reopened_then_chain_acks_and_envelopes_survive(
    journal: Journal, tmp_path: Path
) -> None:
    hashes = [deliver(journal, i) for i in range(3)]
    journal.record_ack(ack_record(3), b"pending")
    journal.close()

    reopened = Journal(tmp_path / "journal.sqlite3", address_of(KEY), DOMAIN)
    try:
        assert reopened.verify() == 3
        book = reopened.deal(7)
        assert book is not None
        assert [book.receipts[i].receipt.prev_receipt_hash for i in range(3)] == [
            ZERO_HASH,
            *hashes[:2],
        ]
        assert [a.key for a in reopened.unfinished()] == [(7, 3)]
        assert reopened.envelope((7, 3)) == b"pending"
        assert book.unpaid_ack_total() == 4 * 500
    finally:
        reopened.close()


def committed_acks(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [int(i) for (i,) in db.execute("SELECT task_index FROM acks ORDER BY task_index")]


def test_journal_when_ack_deferred_then_it_commits_with_its_receipt_or_when_made_durable(
    journal: Journal, tmp_path: Path
) -> None:
    path = tmp_path / "journal.sqlite3"
    journal.record_ack(ack_record(0), b"envelope-0", defer=True)
    assert journal.ack((7, 0)) is not None and journal.envelope((7, 0)) == b"envelope-0"
    assert committed_acks(path) == []  # in memory only: no client holds it yet
    deliver(journal, 0, ack=False)  # the receipt brings the deferred ack in its transaction
    assert committed_acks(path) == [0]
    journal.record_ack(ack_record(1), b"envelope-1", defer=True)
    journal.make_durable((7, 1))  # answered with the ack alone
    journal.make_durable((7, 1))
    assert committed_acks(path) == [0, 1]
    deliver(journal, 1, ack=False)
    journal.record_ack(ack_record(2), b"envelope-2", defer=True)  # never answered
    journal.close()

    reopened = Journal(path, address_of(KEY), DOMAIN)
    try:
        assert reopened.verify() == 2
        book = reopened.deal(7)
        assert book is not None and sorted(book.acks) == [0, 1] and sorted(book.receipts) == [0, 1]
        assert reopened.unfinished() == []
    finally:
        reopened.close()


def envelope_bytes(inputs: bytes, *, weights: bytes | None = b"w" * 3_000) -> bytes:
    return encode_envelope(
        ProgramEnvelope.create(
            program=b"p" * 5_000,
            inputs=inputs,
            producer=ProducerVersions(jax="0.10.2", jaxlib="0.10.2", calling_convention=9),
            platforms=("cpu",),
            weights=weights,
        )
    )


def test_journal_stores_program_and_weights_once_and_gives_back_each_envelope_exactly(
    journal: Journal, tmp_path: Path
) -> None:
    path = tmp_path / "journal.sqlite3"
    sent = {i: envelope_bytes(b"inputs-%d" % i) for i in range(4)}
    sent[4] = envelope_bytes(b"no weights", weights=None)
    journal.record_ack(ack_record(0), sent[0])
    journal.record_ack(ack_record(1), sent[1], defer=True)
    journal.make_durable((7, 1))
    journal.record_ack(ack_record(2), sent[2], defer=True)
    deliver(journal, 2, ack=False)  # the deferred ack commits with its receipt
    journal.record_ack(ack_record(3), sent[3])
    journal.record_ack(ack_record(4), sent[4])
    journal.record_ack(ack_record(5), b"not an envelope")
    with sqlite3.connect(path) as db:
        blobs = sorted(len(data) for (data,) in db.execute("SELECT data FROM blobs"))
        rows = dict(
            db.execute("SELECT task_index, length(data) FROM task_data WHERE part = 'frame'")
        )
    assert blobs == [3_000, 5_000]  # one program, one set of weights, for five envelopes
    assert all(rows[i] < 1_000 for i in range(5)) and rows[5] == len(b"not an envelope")
    journal.close()

    reopened = Journal(path, address_of(KEY), DOMAIN)
    try:
        for i, data in sent.items():
            assert reopened.envelope((7, i)) == data
        assert reopened.envelope((7, 5)) == b"not an envelope"
        with pytest.raises(JournalError, match="no envelope"):
            reopened.envelope((7, 6))
    finally:
        reopened.close()


def test_journal_written_before_shared_blobs_opens_and_serves_its_envelopes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    record = ack_record(0)
    with sqlite3.connect(path) as db:  # the acks table as it was, one row in it
        db.execute(
            "CREATE TABLE acks (deal_id TEXT NOT NULL, task_index INTEGER NOT NULL, "
            "request_json TEXT NOT NULL, request_sig BLOB NOT NULL, request_hash BLOB NOT NULL, "
            "target TEXT, envelope BLOB NOT NULL, ack_json TEXT NOT NULL, ack_sig BLOB NOT NULL, "
            "acked_at REAL NOT NULL, PRIMARY KEY (deal_id, task_index))"
        )
        db.execute(
            "INSERT INTO acks VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                "7",
                0,
                json.dumps({k: v for k, v in record.request.to_json().items() if k != "deadline"}),
                record.request_sig,
                record.request_hash,
                None,
                envelope_bytes(b"old"),
                json.dumps({**record.ack.to_json(), "deadline": 1_000}),  # a v1 ack
                record.ack_sig,
                record.acked_at,
            ),
        )
    journal = Journal(path, address_of(KEY), DOMAIN)
    try:
        assert journal.envelope((7, 0)) == envelope_bytes(b"old")
        journal.record_ack(ack_record(1), envelope_bytes(b"new"))
        assert journal.envelope((7, 1)) == envelope_bytes(b"new")
        assert [a.key for a in journal.unfinished()] == [(7, 0), (7, 1)]
    finally:
        journal.close()


def test_journal_when_someone_updates_a_row_then_the_trigger_refuses(journal: Journal) -> None:
    deliver(journal, 0)
    db = sqlite3.connect(journal.path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("UPDATE receipts SET outputs = x'00'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("DELETE FROM acks")
    finally:
        db.close()


def test_journal_when_a_receipt_is_tampered_then_startup_refuses(
    journal: Journal, tmp_path: Path
) -> None:
    deliver(journal, 0)
    deliver(journal, 1)
    journal.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    db.execute("DROP TRIGGER receipts_no_update")
    row = db.execute("SELECT receipt_json FROM receipts WHERE task_index = 1").fetchone()
    forged = json.loads(row[0]) | {"amount": 10**6}
    db.execute("UPDATE receipts SET receipt_json = ? WHERE task_index = 1", (json.dumps(forged),))
    db.commit()
    db.close()

    with pytest.raises(JournalCorruptError, match="task 1"):
        Journal(tmp_path / "journal.sqlite3", address_of(KEY), DOMAIN)


def test_journal_when_opened_for_another_escrow_then_signatures_fail(
    journal: Journal, tmp_path: Path
) -> None:
    deliver(journal, 0)
    journal.close()
    other = replace(DOMAIN, chain_id=1)
    with pytest.raises(JournalCorruptError, match="signed by"):
        Journal(tmp_path / "journal.sqlite3", address_of(KEY), other)


# ---- config ------------------------------------------------------------------------------


def test_load_config_when_toml_and_env_then_env_wins(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'rpc_url = "http://a"\nescrow = "0x' + "33" * 20 + '"\ndata_dir = "/tmp/x"\n'
        "slo_ms = 5000\npool_size = 2\n[plan]\ninference_price = 7\n[settlement]\n"
        "interval_s = 12\n"
    )
    env = {
        "TPUMARKET_PROVIDER_PRIVATE_KEY": KEY,
        "TPUMARKET_PROVIDER_SLO_MS": "3000",
        "TPUMARKET_PROVIDER_SETTLEMENT_REDEEM_THRESHOLD": "99",
        "HOME": "/root",
    }
    config = load_config(path, env)
    assert config.slo_ms == 3000 and config.slo_s == 3 and config.pool_size == 2
    assert config.plan == Plan(inference_price=7)
    assert config.settlement.interval_s == 12.0
    assert config.settlement.redeem_threshold == 99
    assert config.address == address_of(KEY)
    assert config.data_dir == Path("/tmp/x")


@pytest.mark.parametrize(
    "extra",
    [
        "bogus = 1\n",
        "slo_ms = 10\n",
        "[plan]\nwhat = 1\n",
        "[plan]\ncache_hit_discount_bps = 20000\n",
    ],
)
def test_load_config_when_invalid_then_config_error(tmp_path: Path, extra: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'rpc_url = "x"\nescrow = "y"\ndata_dir = "z"\n{extra}')
    with pytest.raises(ConfigError):
        load_config(path, {"TPUMARKET_PROVIDER_PRIVATE_KEY": KEY})


def test_load_config_when_key_missing_then_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="private_key"):
        load_config(None, {"TPUMARKET_PROVIDER_RPC_URL": "x"})


def test_load_config_when_retired_timer_keys_then_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'rpc_url = "x"\nescrow = "y"\ndata_dir = "z"\n[settlement]\n'
        "redeem_max_age_s = 3600\nsilent_after_s = 86400\nexpiry_margin_s = 300\n"
    )
    with caplog.at_level("WARNING", logger="provider.config"):
        config = load_config(path, {"TPUMARKET_PROVIDER_PRIVATE_KEY": KEY})
    assert config.settlement == SettlementConfig()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "silent_after_s is ignored" in warned and "redeem_max_age_s is ignored" in warned


def test_settlement_config_when_window_cannot_hold_interval_and_tx_then_named_with_a_fix() -> None:
    config = SettlementConfig(interval_s=30, tx_allowance_s=10, margin_fraction=0.5)
    assert config.min_window_s() == 80
    assert config.margin_s(120) == 60
    assert config.window_problem(80) is None
    problem = config.window_problem(60)
    assert problem is not None
    assert "below the 80 s" in problem and "interval_s to at most 20 s" in problem
    assert SettlementConfig().window_problem(60) is None  # the defaults meet the escrow's minimum


@pytest.mark.parametrize(
    "changes",
    [{"interval_s": 0}, {"margin_fraction": 0}, {"margin_fraction": 1.5}, {"claim_batch_max": 0}],
)
def test_settlement_config_when_impossible_then_config_error(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SettlementConfig(**changes)


def test_settle_by_when_deadline_past_expiry_then_expiry_counts() -> None:
    assert settle_by(deadline=100, expiry=500, challenge_window=60) == 160
    assert settle_by(deadline=900, expiry=500, challenge_window=60) == 560


# ---- journal schema versions -------------------------------------------------------------


V1_DOMAIN = replace(DOMAIN, version="1")


def write_v1_journal(path: Path, count: int) -> list[bytes]:
    """Write a journal as a protocol-v1 daemon did: acks with deadlines, no schema version."""
    hashes = []
    previous = ZERO_HASH
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE acks (deal_id TEXT NOT NULL, task_index INTEGER NOT NULL, "
            "request_json TEXT NOT NULL, request_sig BLOB NOT NULL, request_hash BLOB NOT NULL, "
            "target TEXT, envelope BLOB NOT NULL, ack_json TEXT NOT NULL, ack_sig BLOB NOT NULL, "
            "acked_at REAL NOT NULL, program_sha256 BLOB, weights_sha256 BLOB, "
            "PRIMARY KEY (deal_id, task_index))"
        )
        db.execute(
            "CREATE TABLE receipts (seq INTEGER PRIMARY KEY AUTOINCREMENT, deal_id TEXT NOT NULL, "
            "task_index INTEGER NOT NULL, receipt_json TEXT NOT NULL, receipt_sig BLOB NOT NULL, "
            "receipt_hash BLOB NOT NULL, outputs BLOB NOT NULL, detail_json TEXT NOT NULL, "
            "recorded_at REAL NOT NULL, UNIQUE (deal_id, task_index))"
        )
        for index in range(count):
            v1_request = {k: v for k, v in request(index).to_json().items() if k != "deadline"}
            v1_ack = {
                "deal_id": 7,
                "task_index": index,
                "request_hash": "0x" + "ab" * 32,
                "deadline": 1_000 + index,
                "price": 500,
            }
            db.execute(
                "INSERT INTO acks VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                ("7", index, json.dumps(v1_request), b"\x01" * 65, b"\xab" * 32, None,
                 b"envelope", json.dumps(v1_ack), b"\x02" * 65, float(index), None, None),
            )  # fmt: skip
            receipt = build_receipt(
                PLAN,
                replace(request(index), deadline=1_000 + index),
                deadline=1_000 + index,
                outputs=b"o",
                status=0,
                device_ms=1,
                compile_ms=0,
                cache_hit=False,
                started_at=1,
                finished_at=2,
                prev_receipt_hash=previous,
            )
            previous = receipt.struct_hash()
            hashes.append(previous)
            db.execute(
                "INSERT INTO receipts (deal_id, task_index, receipt_json, receipt_sig, "
                "receipt_hash, outputs, detail_json, recorded_at) VALUES (?,?,?,?,?,?,?,?)",
                ("7", index, json.dumps(receipt.to_json()), receipt.sign(V1_DOMAIN, KEY),
                 previous, b"o", "{}", 0.0),
            )  # fmt: skip
    return hashes


def test_journal_when_written_under_protocol_v1_then_migrated_readable_and_not_claimable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sqlite3"
    hashes = write_v1_journal(path, 2)

    with caplog.at_level("WARNING", logger="provider.journal"):
        journal = Journal(path, address_of(KEY), DOMAIN)
    try:
        assert journal.migrated_from == 1 and journal.schema_version() == SCHEMA_VERSION
        assert journal.verify() == 2  # v1 receipts verify under the v1 domain
        book = journal.deal(7)
        assert book is not None
        old = book.acks[1]
        assert old.protocol == 1 and not old.claimable
        assert old.request.deadline == 1_001 == book.receipts[1].receipt.deadline
        assert old.ack_json()["deadline"] == 1_001 and old.ack.price == 500
        assert book.last_receipt_hash == hashes[-1]
        assert "cannot be claimed under v2" in caplog.text
        with journal.lock:  # a v2 task after them extends the same chain
            journal.record_ack(ack_record(2), b"envelope-2")
            receipt = build_receipt(
                PLAN,
                request(2),
                deadline=1_000,
                outputs=b"o",
                status=0,
                device_ms=1,
                compile_ms=0,
                cache_hit=False,
                started_at=1,
                finished_at=2,
                prev_receipt_hash=journal.next_prev_hash(7),
            )
            journal.record_receipt(receipt, receipt.sign(DOMAIN, KEY), b"o", {})
        assert book.acks[2].claimable
    finally:
        journal.close()

    again = Journal(path, address_of(KEY), DOMAIN)
    try:
        assert again.migrated_from is None and again.verify() == 3
        assert [again.deal(7).acks[i].protocol for i in range(3)] == [1, 1, 2]  # type: ignore[union-attr]
    finally:
        again.close()


def test_journal_when_written_by_a_newer_daemon_then_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(JournalError, match="newer daemon"):
        Journal(path, address_of(KEY), DOMAIN)


def test_unpaid_ack_total_when_a_task_is_refunded_or_claimed_then_counted_once(
    journal: Journal,
) -> None:
    for index in range(4):
        journal.record_ack(ack_record(index), b"e")
    book = journal.deal(7)
    assert book is not None and book.unpaid_ack_total() == 4 * 500
    journal.record_settlement(7, "refunded", {"tasks": [0]}, None)  # in `committed` on chain
    journal.record_settlement(7, "claim", {"batch_id": 0, "tasks": [1], "amount": "500"}, None)
    assert book.unpaid_ack_total() == 2 * 500
    assert book.on_chain(0) and book.on_chain(1) and not book.on_chain(2)


# ---- heartbeat ---------------------------------------------------------------------------


class _Market(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.path, body))
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def market() -> Iterator[str]:
    _Market.received = []
    _Market.status = 200
    server = HTTPServer(("127.0.0.1", 0), _Market)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_heartbeat_when_market_configured_then_signed_advert_posted(market: str) -> None:
    advert = build_advert(capacity=None, plan=PLAN, slo_ms=2000, endpoint="http://p", domain=DOMAIN)
    metrics = ProviderMetrics()
    beat = Heartbeat(
        MarketHttp(market),
        private_key=KEY,
        provider=address_of(KEY),
        advert=advert,
        domain=DOMAIN,
        metrics=metrics,
    )

    assert beat.beat() is True

    path, body = _Market.received[0]
    assert path == "/v1/providers/heartbeat"
    assert body["advert"]["plan_hash"] == "0x" + PLAN.struct_hash().hex()
    message = heartbeat_message(body["provider"], body["timestamp"], body["advert"])
    signed_under = market_domain(DOMAIN.chain_id, DOMAIN.verifying_contract)
    assert message.recover(signed_under, bytes.fromhex(body["signature"][2:])) == address_of(KEY)


def test_heartbeat_when_market_refuses_then_counted_not_raised(market: str) -> None:
    _Market.status = 503
    advert = build_advert(capacity=None, plan=PLAN, slo_ms=2000, endpoint="", domain=DOMAIN)
    metrics = ProviderMetrics()
    beat = Heartbeat(
        MarketHttp(market),
        private_key=KEY,
        provider=address_of(KEY),
        advert=advert,
        domain=DOMAIN,
        metrics=metrics,
    )
    assert beat.beat() is False
    assert b'tpumarket_provider_heartbeats_total{result="failed"} 1.0' in metrics.render()


def test_market_http_when_unreachable_then_market_http_error() -> None:
    client = MarketHttp("http://127.0.0.1:9", timeout_s=1)
    with pytest.raises(MarketHttpError):
        client.heartbeat(signed_heartbeat(KEY, address_of(KEY), {"x": 1}, DOMAIN))


# ---- CLI ---------------------------------------------------------------------------------


def test_cli_register_when_added_to_tpumarket_then_provider_run_parses() -> None:
    import argparse

    from provider.cli import register

    parser = argparse.ArgumentParser(prog="tpumarket")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["provider", "run", "--config", "p.toml", "--port", "9", "--no-jobs"])
    assert args.config == Path("p.toml") and args.port == 9 and args.no_jobs
    assert callable(args.handler)


def test_cli_when_config_invalid_then_exit_code_2(tmp_path: Path, capsys: Any) -> None:
    from provider.cli import main

    path = tmp_path / "p.toml"
    path.write_text("bogus = 1\n")
    assert main(["run", "--config", str(path)]) == 2
    assert "error:" in capsys.readouterr().err


# ---- money: log lines and counters that survive restarts ---------------------------------


def sample(daemon: Daemon, name: str, **labels: str) -> float | None:
    value: float | None = daemon.metrics.registry.get_sample_value(name, labels)
    return value


def money_sample(daemon: Daemon, name: str, **labels: str) -> float:
    value = daemon.metrics.registry.get_sample_value(f"tpumarket_provider_{name}_total", labels)
    return 0.0 if value is None else value


def test_money_events_when_redeemed_and_refunded_then_logged_counted_and_recounted_on_restart(
    chain_world: ChainWorld,
    sandbox: Sandbox,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    config = provider_config(world, tmp_path)
    node = Daemon(config, chain=world.chain, sandbox=sandbox)
    try:
        node.start(schedule=False)
        with TestClient(create_app(node)) as api:
            answers = []
            for index in range(2):
                task = sign_task(world, world.client, deal_id, index, tiny_mlp_envelope()[0])
                reply = api.post(
                    "/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60}
                )
                answers.append((task, reply.json()))
            paid = Receipt.from_json(answers[0][1]["receipt"])
            voucher = Voucher(
                deal_id=deal_id, cumulative_amount=paid.amount, tasks=task_bitmap([0])
            )
            body = {
                "voucher": voucher.to_json(),
                "signature": "0x" + voucher.sign(world.domain, world.client).hex(),
            }
            assert api.post("/v1/vouchers", json=body).status_code == 200
        late, answer = answers[1]
        ack = Ack.from_json(answer["ack"])
        with caplog.at_level("INFO", logger="provider"):
            assert len(node.jobs.redeem_due(force=True)) == 1
            deal = world.escrow.get_deal(deal_id)
            world.advance_to(
                settle_by(late.request.deadline, deal.expiry, deal.challenge_window) + 1
            )
            world.escrow.refund_breach(
                world.client, late.request, ack, bytes.fromhex(answer["ack_signature"][2:])
            )
            node.jobs.watch_deals([deal_id])
        lines = {r.getMessage(): vars(r) for r in caplog.records if r.name.startswith("provider")}
        assert lines["voucher redeemed"]["paid"] == paid.amount
        refunded = lines["tasks refunded to the client, with the deal's penalty"]
        assert (refunded["tasks"], refunded["refund"], refunded["penalty"]) == (
            [1],
            ack.price,
            PENALTY,
        )
        live = {
            "redeem": money_sample(node, "money_events", event="redeem"),
            "refunded": money_sample(node, "money_events", event="refunded"),
            "penalty": money_sample(node, "money_amount", event="refunded", what="penalty"),
            "paid": money_sample(node, "paid_amount"),
        }
        assert live == {"redeem": 1, "refunded": 1, "penalty": PENALTY, "paid": paid.amount}
    finally:
        node.close()

    restarted = Daemon(config, chain=world.chain, sandbox=sandbox)  # a fresh process's counters
    try:
        assert {
            "redeem": money_sample(restarted, "money_events", event="redeem"),
            "refunded": money_sample(restarted, "money_events", event="refunded"),
            "penalty": money_sample(restarted, "money_amount", event="refunded", what="penalty"),
            "paid": money_sample(restarted, "paid_amount"),
        } == live
        assert b'tpumarket_provider_money_events_total{event="redeem"} 1.0' in (
            restarted.metrics.render()
        )
    finally:
        restarted.close()


def test_configure_logging_when_scheduler_chatter_not_asked_then_only_its_errors_show() -> None:
    import logging

    from provider.logs import configure_logging

    configure_logging("INFO")
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.ERROR
    assert logging.getLogger("provider").getEffectiveLevel() == logging.INFO
    configure_logging("INFO", scheduler=True)
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.INFO
    configure_logging("INFO")


def test_settlement_when_the_chain_stalls_then_named_as_such_and_counted(
    sandbox: Sandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os
    import signal

    world = start_world()  # its own chain: this test freezes it
    node = Daemon(
        provider_config(world, tmp_path, settlement=SettlementConfig(interval_s=0.2)),
        chain=world.chain,
        sandbox=sandbox,
    )
    stopped = False
    try:
        node.start(schedule=False)
        world.open_deal()  # a deal to watch, so each pass reads the chain
        node.jobs.discover_deals()
        with caplog.at_level("WARNING", logger="provider"):
            os.kill(world.anvil.pid, signal.SIGSTOP)  # the node answers nothing from now on
            stopped = True
            node.jobs.start()
            wait_until(
                lambda: (sample(node, "tpumarket_provider_chain_stalls_total") or 0) >= 1,
                30,
                "a stall",
            )
        os.kill(world.anvil.pid, signal.SIGCONT)
        stopped = False
        stall = [r for r in caplog.records if "stalled" in r.getMessage()]
        assert stall and stall[0].levelname == "WARNING"
        assert vars(stall[0])["rpc_url"] == world.anvil.url
        assert vars(stall[0])["interval_s"] == 0.2
    finally:
        if stopped:
            os.kill(world.anvil.pid, signal.SIGCONT)
        node.close()
        world.anvil.stop()


def test_daemon_when_its_ask_quotes_a_window_it_cannot_serve_then_start_refused(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path: Path
) -> None:
    world = chain_world
    terms = AskConfig(
        price=1_000,
        quantity=1,
        stake=10**6,
        penalty=PENALTY,
        arbiter=address_of(world.arbiter),
        challenge_window=20,
    )
    node = Daemon(provider_config(world, tmp_path, ask=terms), chain=world.chain, sandbox=sandbox)
    try:
        with pytest.raises(ConfigError, match=r"the \[ask\] in the config: a challenge window"):
            node.start(schedule=False)
    finally:
        node.close()


def test_load_config_when_ask_section_then_terms_read_and_arbiter_checksummed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "provider.toml"
    path.write_text(
        f'private_key = "{KEY}"\nrpc_url = "http://x"\nescrow = "0x{"22" * 20}"\n'
        'data_dir = "/tmp/x"\n[ask]\nprice = 7\nquantity = 3\nstake = 9\npenalty = 1\n'
        f'arbiter = "0x{"ab" * 20}"\n'
    )
    ask = load_config(path, env={"TPUMARKET_PROVIDER_ASK_QUANTITY": "5"}).ask
    assert ask is not None
    assert (ask.price, ask.quantity, ask.stake, ask.compile_checks) == (7, 5, 9, True)
    assert ask.arbiter == to_address("0x" + "ab" * 20)
    path.write_text(path.read_text().replace("penalty = 1\n", ""))
    with pytest.raises(ConfigError, match=r"ask lacks \['penalty'\]"):
        load_config(path, env={})
