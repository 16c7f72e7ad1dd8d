"""The deal status is one enum: the reads produce only its values and the page styles each."""

from __future__ import annotations

import re
from pathlib import Path

from market.deal_states import DealStatus
from market.models import ChainDeal, DealPublic

STYLE = Path(__file__).resolve().parents[2] / "market" / "web" / "style.css"


def test_every_status_has_a_page_style_and_no_style_names_another() -> None:
    styled = set(re.findall(r"\.status\.([a-z_]+)", STYLE.read_text()))
    assert styled == {status.value for status in DealStatus}


def test_the_api_schema_lists_exactly_the_enum() -> None:
    schema = DealPublic.model_json_schema()
    enum = schema["$defs"]["DealStatus"]["enum"]
    assert enum == [status.value for status in DealStatus]


def test_a_chain_record_starts_opened_and_compares_equal_to_its_text() -> None:
    assert ChainDeal.model_fields["status"].default == DealStatus.OPENED
    assert DealStatus.CLOSED.value == "closed" and str(DealStatus.CLOSED) == "closed"
