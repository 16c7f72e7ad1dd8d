"""Tests of snapshot and restore: plain data out, the same engine back, bad data rejected."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from market import storage
from market.engine import ORDER_FIELDS, MatchingEngine, Order, OrderRecord, OrderState, Side
from market.engine import orders as orders_module
from market.engine.snapshot import PROGRESS_FIELDS, RECORD_FIELDS, OrderData, record_to_data
from market.errors import SnapshotError
from market.models import Order as OrderRow
from market.models import OrderCreate, OrderPublic
from tests.market.builders import NOW, ask, bid


def busy_engine() -> MatchingEngine:
    """Return an engine with orders in every remembered lifecycle state, two classes and two
    plans (an expired order is forgotten as it expires)."""
    engine = MatchingEngine()
    engine.place(ask("a-open", price=105, quantity=5), now=NOW)
    engine.place(ask("a-part", price=101, quantity=8), now=NOW)
    engine.place(bid("b-fill", price=101, quantity=3), now=NOW)
    engine.place(ask("a-cancel", price=110), now=NOW)
    engine.cancel("a-cancel")
    engine.place(bid("b-exp", price=90, expiry=NOW + 5), now=NOW)
    engine.expire(NOW + 5)
    engine.place(bid("b-open", price=95, plan="flat"), now=NOW)
    engine.place(ask("c-open", device_class="cpu", price=3), now=NOW)
    engine.place(ask("a-slow", price=99, slo_ms=900), now=NOW)
    return engine


def test_snapshot_is_json_ready_and_lists_every_order_in_sequence() -> None:
    snap = busy_engine().snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert [o["order_id"] for o in snap["orders"]] == [
        "a-open",
        "a-part",
        "b-fill",
        "a-cancel",
        "b-open",
        "c-open",
        "a-slow",
    ]  # b-exp expired and, its expiry past, was forgotten
    states = {o["order_id"]: o["state"] for o in snap["orders"]}
    assert states["a-part"] == "partially_filled"
    assert states["a-cancel"] == "cancelled"


def test_restore_gives_the_same_state() -> None:
    engine = busy_engine()
    restored = MatchingEngine.restore(json.loads(json.dumps(engine.snapshot())))
    assert restored.snapshot() == engine.snapshot()
    assert restored.records() == engine.records()
    for device_class in engine.device_classes():
        for side in Side:
            assert restored.depth(device_class, side) == engine.depth(device_class, side)
            assert restored.open_orders(device_class, side) == engine.open_orders(
                device_class, side
            )
    assert restored.device_classes() == engine.device_classes()
    assert restored.next_seq == engine.next_seq
    assert restored.next_fill_id == engine.next_fill_id


def test_restore_gives_the_same_future_fills() -> None:
    engine = busy_engine()
    restored = MatchingEngine.restore(engine.snapshot())
    for target in (engine, restored):
        target.place(bid("b-new", price=120, quantity=20), now=NOW + 1)
        target.place(ask("a-new", price=80, plan="flat"), now=NOW + 1)
    assert restored.snapshot() == engine.snapshot()
    later = [e.place(ask("a-late", price=1, slo_ms=50), now=NOW + 2) for e in (engine, restored)]
    assert later[0] == later[1]
    assert later[0]


def test_restore_of_empty_snapshot_gives_empty_engine() -> None:
    restored = MatchingEngine.restore(MatchingEngine().snapshot())
    assert len(restored) == 0
    assert restored.next_seq == 1


def _broken(change: str) -> dict[str, Any]:
    snap: dict[str, Any] = copy.deepcopy(dict(busy_engine().snapshot()))
    orders = snap["orders"]
    match change:
        case "version":
            snap["version"] = 99
        case "next_seq_missing":
            del snap["next_seq"]
        case "next_seq_bool":
            snap["next_seq"] = True
        case "next_fill_id_zero":
            snap["next_fill_id"] = 0
        case "orders_not_list":
            snap["orders"] = {}
        case "order_not_mapping":
            orders[0] = ["a-open"]
        case "bad_side":
            orders[0]["side"] = "buy"
        case "bad_state":
            orders[0]["state"] = "matched"
        case "bad_price":
            orders[0]["price"] = 0
        case "price_as_string":
            orders[0]["price"] = "105"
        case "open_but_partly_filled":
            orders[0]["remaining"] = 1
        case "filled_with_remainder":
            orders[2]["remaining"] = 1
        case "cancelled_with_nothing_left":
            orders[3]["remaining"] = 0
        case "partial_with_nothing_filled":
            orders[1]["remaining"] = orders[1]["quantity"]
        case "duplicate_id":
            orders[1]["order_id"] = orders[0]["order_id"]
        case "duplicate_seq":
            orders[1]["seq"] = orders[0]["seq"]
        case "seq_beyond_next":
            orders[-1]["seq"] = snap["next_seq"]
        case _:
            raise AssertionError(change)
    return snap


@pytest.mark.parametrize(
    "change",
    [
        "version",
        "next_seq_missing",
        "next_seq_bool",
        "next_fill_id_zero",
        "orders_not_list",
        "order_not_mapping",
        "bad_side",
        "bad_state",
        "bad_price",
        "price_as_string",
        "open_but_partly_filled",
        "filled_with_remainder",
        "cancelled_with_nothing_left",
        "partial_with_nothing_filled",
        "duplicate_id",
        "duplicate_seq",
        "seq_beyond_next",
    ],
)
def test_restore_when_snapshot_is_inconsistent_then_raises_snapshot_error(change: str) -> None:
    with pytest.raises(SnapshotError):
        MatchingEngine.restore(_broken(change))


def test_restore_when_data_is_not_a_mapping_then_raises_snapshot_error() -> None:
    with pytest.raises(SnapshotError):
        MatchingEngine.restore([])  # type: ignore[arg-type]


def test_order_fields_when_declared_once_then_records_rows_and_models_follow_them() -> None:
    order = Order(Side.ASK, "0xab", "0xcd", "tpu", 3, 7, "metered", 50, 9, 99)
    record = OrderRecord(order, 4, OrderState.OPEN, 3)
    assert tuple(OrderData.__annotations__) == RECORD_FIELDS == (*ORDER_FIELDS, *PROGRESS_FIELDS)
    assert tuple(record_to_data(record)) == RECORD_FIELDS
    assert repr(order).startswith("Order(side=<Side.ASK: 'ask'>, order_id='0xab', owner='0xcd'")
    row = storage.order_row(order, *range(len(storage.ORDER_STORED_FIELDS)))
    by_column = dict(zip(storage.ORDER_COLUMNS, row, strict=True))
    assert by_column["side"] == "ask" and by_column["price"] == 7 and by_column["nonce"] == 0
    assert set(storage.ORDER_COLUMNS) == set(OrderRow.model_fields)
    for model in (OrderCreate, OrderPublic):  # every field an owner signs, but the derived id
        assert set(ORDER_FIELDS) - {"order_id"} <= set(model.model_fields)


def test_order_class_when_compiled_then_its_literal_slots_and_parameters_are_order_fields() -> None:
    source = (Path(orders_module.__file__ or "").parent / "orders.py").read_text()
    [cls] = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "Order"
    ]
    [slots] = [
        node.value
        for node in cls.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__slots__"
    ]
    [init] = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    assert sorted(ast.literal_eval(slots)) == sorted(ORDER_FIELDS)
    assert tuple(a.arg for a in init.args.args[1:]) == ORDER_FIELDS
