"""The client SDK against a provider that acks a deal's indexes only in order, refuses tasks on
a deal its client agreed to close, and judges counterparties by their code.

A real daemon process over HTTP on anvil with the real escrow.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from client.accounts import ClientAccount
from client.deal_guards import CodeCheck, CounterpartyHasCode, DealClosing
from client.errors import ProviderRejected
from client.provider_http import ProviderHttp, TaskView
from client.session import DealSession
from client.tasks import TaskSpec
from client.vouchers import VoucherBook
from contracts.chain import rpc
from contracts.messages import KIND_INFERENCE, Plan, TaskRequest
from contracts.signer_code import code_kind
from programs.envelope import ProgramEnvelope
from tests.e2e.stack import Provider, Stack, spin_inputs, spin_model, stack
from tests.polling import wait_until

PLAN = Plan(compile_price=2_000, inference_price=1_000)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Provider]]:
    with stack(tmp_path_factory.mktemp("guards"), lean=True) as built:
        provider = built.start_provider("ordered", PLAN, slo_ms=2_000)
        built.escrow.deposit(built.client, 10**7)
        yield built, provider


def _envelope(seed: int) -> ProgramEnvelope:
    model = spin_model()
    inputs = spin_inputs(model, 1_000, seed)
    return model.envelope(*(inputs[s.key] for s in model.signature.inputs))


class CountingProvider(ProviderHttp):
    """A provider connection that counts the ``task_index_out_of_order`` refusals it gets."""

    def __init__(self, base_url: str, client_key: str) -> None:
        super().__init__(base_url, client_key=client_key)
        self.out_of_order: list[int] = []

    def submit(self, request: TaskRequest, *args: Any, **kwargs: Any) -> TaskView:
        try:
            return super().submit(request, *args, **kwargs)
        except ProviderRejected as exc:
            if exc.error == "task_index_out_of_order":
                self.out_of_order.append(request.task_index)
            raise


def _session(st: Stack, provider: Provider, connection: ProviderHttp | None = None) -> DealSession:
    deal_id = st.open_deal(st.quote(provider, max_spend=100_000, window=60), provider)
    deal = st.escrow.get_deal(deal_id)
    return DealSession(
        provider=connection or ProviderHttp(provider.url, client_key=st.client),
        account=ClientAccount(st.escrow, st.token, st.client, min_challenge_window=10),
        domain=st.escrow.domain,
        deal_id=deal_id,
        plan=PLAN,
        provider_address=provider.address,
        book=VoucherBook(deal_id=deal_id, cap=deal.max_spend),
        challenge_window=deal.challenge_window,
    )


def test_send_when_a_later_index_goes_first_then_it_is_acked_after_the_earlier_one(
    world: tuple[Stack, Provider],
) -> None:
    st, provider = world
    connection = CountingProvider(provider.url, st.client)
    session = _session(st, provider, connection)
    spec = TaskSpec(KIND_INFERENCE, _envelope(1), 10_000)
    first, second = session.sign_request(0, spec), session.sign_request(1, spec)
    errors: list[BaseException] = []

    def send_second() -> None:
        try:
            session.send(second)
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    later = threading.Thread(target=send_second)
    later.start()
    wait_until(lambda: connection.out_of_order == [1], 60, "the provider refusing index 1 first")
    session.send(first)
    later.join()

    assert errors == []
    assert first.ack is not None and second.ack is not None
    assert (first.ack.task_index, second.ack.task_index) == (0, 1)


def test_submit_when_refused_before_the_ack_then_the_index_is_taken_by_the_next_task(
    world: tuple[Stack, Provider],
) -> None:
    st, provider = world
    session = _session(st, provider)
    with pytest.raises(ProviderRejected) as refused:
        session.submit(TaskSpec(KIND_INFERENCE, _envelope(2), 999))  # below the plan's price
    assert refused.value.error == "price_above_max"
    assert session.next_index == 0

    outcome = session.submit(TaskSpec(KIND_INFERENCE, _envelope(2), 10_000))

    assert outcome.index == 0 and outcome.ack is not None


def test_submit_when_the_client_agreed_to_close_then_no_task_is_sent(
    world: tuple[Stack, Provider],
) -> None:
    st, provider = world
    session = _session(st, provider)
    assert session.submit(TaskSpec(KIND_INFERENCE, _envelope(3), 10_000)).ack is not None
    session.account.close(session.deal_id)  # the client's early-close agreement

    with pytest.raises(DealClosing):
        session.submit(TaskSpec(KIND_INFERENCE, _envelope(4), 10_000))
    assert session.next_index == 1


def test_code_check_reads_the_counterpartys_code_on_chain(world: tuple[Stack, Provider]) -> None:
    st, _ = world
    w3 = st.chain.w3
    address = "0x" + "77" * 20

    def set_code(code: bytes) -> None:
        rpc(st.anvil.url, "anvil_setCode", [address, "0x" + code.hex()])

    check = CodeCheck(lambda a: bytes(w3.eth.get_code(w3.to_checksum_address(a))))
    assert check.check(address) == "none"
    set_code(b"\xef\x01\x00" + b"\x5a" * 20)  # an EIP-7702 delegation: its ECDSA acks stand
    assert check.check(address) == "delegated"
    set_code(bytes.fromhex("600160005260206000f3"))  # a contract wallet
    with pytest.raises(CounterpartyHasCode):
        check.check(address)
    check.allow_code = True
    assert check.check(address) == "contract"


def test_code_kind_tells_a_delegation_from_contract_code() -> None:
    assert code_kind(b"") == "none"
    assert code_kind(b"\xef\x01\x00" + bytes(20)) == "delegated"
    assert code_kind(b"\xef\x01\x00" + bytes(21)) == "contract"  # not exactly 23 bytes
    assert code_kind(b"\xef\x01\x01" + bytes(20)) == "contract"
