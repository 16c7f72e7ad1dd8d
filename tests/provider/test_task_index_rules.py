"""Which tasks the daemon acks: indexes the escrow can settle, in order, priced by count; and
no task for a deal whose client has code that withdraws signatures, or agreed to close it.

A real daemon (tiered plan) on the shared anvil with the real escrow, over its HTTP API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.chain import rpc
from contracts.messages import KIND_INFERENCE, STATUS_SUCCESS, address_of
from contracts.pricing import price, tiered
from contracts.signer_code import CodeKind
from programs.envelope import ProgramEnvelope
from provider.api import create_app
from provider.counterparty import CounterpartyCode, chain_code
from provider.daemon import Daemon
from provider.errors import RejectedError
from provider.sandbox import Sandbox
from provider.task_index import MAX_TASKS
from tests.polling import wait_until
from tests.provider.daemon_support import (
    PLAN,
    SLO_S,
    ChainWorld,
    SignedTask,
    provider_config,
    sign_task,
    tiny_mlp_envelope,
)

TIERED = tiered(PLAN, tiers=((2, 2_000), (4, 5_000)))
"""Inference 500 at tasks 0-1, 400 at 2-3, 250 from task 4 on."""


@pytest.fixture(scope="module")
def daemon(
    chain_world: ChainWorld, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """A daemon quoting the tiered plan (its jobs triggered by hand)."""
    data = tmp_path_factory.mktemp("provider-data")
    config = provider_config(chain_world, data, plan=TIERED)
    node = Daemon(config, chain=chain_world.chain, sandbox=sandbox)
    node.start(schedule=False)
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def api(daemon: Daemon) -> Iterator[TestClient]:
    with TestClient(create_app(daemon)) as client:
        yield client


@pytest.fixture(scope="module")
def envelope() -> ProgramEnvelope:
    return tiny_mlp_envelope()[0]


def submit(api: TestClient, task: SignedTask) -> Any:
    return api.post("/v1/tasks", content=task.body, headers=task.headers())


def tier_price(index: int) -> int:
    return price(
        TIERED,
        kind=KIND_INFERENCE,
        status=STATUS_SUCCESS,
        cache_hit=False,
        device_ms=0,
        task_index=index,
    )


def test_max_tasks_mirrors_the_compiled_escrow(chain_world: ChainWorld) -> None:
    assert chain_world.escrow.contract.functions.MAX_TASKS().call() == MAX_TASKS


def test_index_the_escrow_cannot_settle_is_refused_before_the_ack(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon, envelope: ProgramEnvelope
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED)
    for index in (MAX_TASKS, 70_000, 2**32 - 1):
        reply = submit(api, sign_task(world, world.client, deal_id, index, envelope))
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == "task_index_out_of_range"
        assert str(MAX_TASKS - 1) in reply.json()["reason"]
        assert daemon.journal.ack((deal_id, index)) is None


def test_indexes_are_acked_only_in_order_and_a_refusal_consumes_none(
    api: TestClient, chain_world: ChainWorld, envelope: ProgramEnvelope
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED)
    deep = submit(api, sign_task(world, world.client, deal_id, 1_000, envelope))
    assert deep.status_code == 400, deep.text
    assert deep.json()["error"] == "task_index_out_of_order"
    assert deep.json()["reason"].endswith("expected 0")

    first = sign_task(world, world.client, deal_id, 0, envelope)
    assert submit(api, first).json()["ack"]["price"] == 500
    assert submit(api, first).json()["created"] is False  # a resubmission stays idempotent
    cheap = sign_task(world, world.client, deal_id, 1, envelope, max_price=499)
    assert submit(api, cheap).json()["error"] == "price_above_max"  # refused before the ack
    second = sign_task(world, world.client, deal_id, 1, envelope)
    assert submit(api, second).json()["ack"]["price"] == 500
    third = submit(api, sign_task(world, world.client, deal_id, 2, envelope)).json()
    assert third["ack"]["price"] == 400  # the third task acked: the plan's first tier


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    indexes=st.lists(
        st.one_of(
            st.integers(0, 6),
            st.integers(7, MAX_TASKS + 10),
            st.integers(MAX_TASKS, 2**32 - 1),
        ),
        max_size=10,
    )
)
def test_acked_indexes_always_form_a_prefix_priced_by_count(
    api: TestClient, chain_world: ChainWorld, envelope: ProgramEnvelope, indexes: list[int]
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED)
    deadline = world.chain_time() + SLO_S + 60
    signed: dict[int, SignedTask] = {}
    acked: list[int] = []
    for index in indexes:
        task = signed.setdefault(
            index, sign_task(world, world.client, deal_id, index, envelope, deadline=deadline)
        )
        reply = submit(api, task)
        body = reply.json()
        if index >= MAX_TASKS:
            assert body["error"] == "task_index_out_of_range"
        elif index < len(acked):
            assert body["created"] is False and body["ack"]["price"] == tier_price(index)
        elif index > len(acked):
            assert body["error"] == "task_index_out_of_order"
            assert body["reason"].endswith(f"expected {len(acked)}")
        else:
            assert reply.status_code == 200, reply.text
            assert body["ack"]["price"] == tier_price(index)  # the n-th ack: the n-th tier
            acked.append(index)
        assert acked == list(range(len(acked)))


def test_client_that_agreed_to_close_gets_no_new_task_acked(
    api: TestClient, chain_world: ChainWorld, daemon: Daemon, envelope: ProgramEnvelope
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED)
    first = sign_task(world, world.client, deal_id, 0, envelope)
    assert submit(api, first).status_code == 200
    world.escrow.close_deal(world.client, deal_id)  # the client's early-close agreement
    assert world.escrow.get_deal(deal_id).client_agreed_close
    daemon.deals.invalidate(deal_id)  # as its cache TTL passing would: the state is read again

    reply = submit(api, sign_task(world, world.client, deal_id, 1, envelope))

    assert reply.json()["error"] == "deal_closing", reply.text
    assert submit(api, first).json()["created"] is False  # an acked task is still served


# ---- counterparties with code --------------------------------------------------------------


def set_code(world: ChainWorld, address: str, code: bytes) -> None:
    rpc(world.anvil.url, "anvil_setCode", [address, "0x" + code.hex()])


@pytest.fixture
def coded_client(chain_world: ChainWorld) -> Iterator[str]:
    """A funded client key (the world's seventh account) whose code a test sets; reset after."""
    key = chain_world.anvil.keys[6]
    try:
        yield key
    finally:
        set_code(chain_world, address_of(key), b"")


def test_client_with_contract_code_is_refused_before_the_ack(
    api: TestClient,
    chain_world: ChainWorld,
    daemon: Daemon,
    envelope: ProgramEnvelope,
    coded_client: str,
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED, client=coded_client)
    # A contract wallet: its ERC-1271 answers could change after the provider delivered.
    set_code(world, address_of(coded_client), bytes.fromhex("600160005260206000f3"))

    reply = submit(api, sign_task(world, coded_client, deal_id, 0, envelope))

    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "counterparty_has_code"
    assert daemon.journal.ack((deal_id, 0)) is None


def test_client_with_a_7702_delegation_is_accepted(
    api: TestClient, chain_world: ChainWorld, envelope: ProgramEnvelope, coded_client: str
) -> None:
    world = chain_world
    delegate = bytes.fromhex("5a" * 20)
    set_code(world, address_of(coded_client), b"\xef\x01\x00" + delegate)
    deal_id = world.open_deal(plan=TIERED, client=coded_client)

    reply = submit(api, sign_task(world, coded_client, deal_id, 0, envelope))

    assert reply.status_code == 200, reply.text
    assert reply.json()["ack"]["price"] == 500


def test_concurrent_submissions_take_each_index_once_and_in_order(
    chain_world: ChainWorld, daemon: Daemon, envelope: ProgramEnvelope
) -> None:
    world = chain_world
    deal_id = world.open_deal(plan=TIERED)
    deadline = world.chain_time() + SLO_S + 60
    tasks = [
        sign_task(world, world.client, deal_id, i, envelope, deadline=deadline) for i in range(8)
    ]
    refused: list[int] = []
    created: list[int] = []
    lock = threading.Lock()

    def submit_until_acked(task: SignedTask) -> None:
        header = json.dumps(task.request.to_json())
        while True:  # every thread at once: the daemon's lock decides who takes each index
            try:
                answer = daemon.service.submit(header, "0x" + task.signature.hex(), None, task.body)
            except RejectedError as exc:
                assert exc.code == "task_index_out_of_order", exc
                with lock:
                    refused.append(task.request.task_index)
                continue
            with lock:
                if answer.created:
                    created.append(task.request.task_index)
            return

    threads = [threading.Thread(target=submit_until_acked, args=(t,)) for t in reversed(tasks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert created == list(range(8))  # each index acked once, each after the one before
    book = daemon.journal.deal(deal_id)
    assert book is not None
    assert {i: a.ack.price for i, a in book.acks.items()} == {i: tier_price(i) for i in range(8)}


def test_counterparty_code_is_cached_per_address_and_read_again_for_a_new_deal(
    chain_world: ChainWorld,
) -> None:
    world = chain_world
    address = "0x" + "76" * 20
    now = [0.0]
    code = CounterpartyCode(chain_code(world.chain.w3), ttl_s=30, clock=lambda: now[0])
    reject = RejectedError  # the refusal as the task checks make it

    assert code.check(address, 1, reject) is CodeKind.NONE
    set_code(world, address, bytes.fromhex("600160005260206000f3"))
    assert code.check(address, 1, reject) is CodeKind.NONE  # within the TTL: no read
    assert code.reads == 1
    with pytest.raises(RejectedError) as refused:  # a new deal reads it again
        code.check(address, 2, reject)
    assert refused.value.code == "counterparty_has_code" and code.reads == 2
    set_code(world, address, b"")
    now[0] = 31.0  # past the TTL: the cached answer serves while a thread reads it again
    with pytest.raises(RejectedError):
        code.check(address, 2, reject)
    wait_until(lambda: code.reads == 3, 30, "the background read")
    assert code.check(address, 2, reject) is CodeKind.NONE
