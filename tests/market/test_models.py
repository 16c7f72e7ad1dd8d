"""The request model of an order repeats the stored order's signed fields exactly."""

from __future__ import annotations

from market.models import OrderBase, OrderCreate


def test_order_create_when_compared_with_order_base_then_fields_and_bounds_are_the_same() -> None:
    create = OrderCreate.model_json_schema()["properties"]
    base = OrderBase.model_json_schema()["properties"]
    assert list(create)[: len(base)] == list(base)
    for name, schema in base.items():
        assert create[name] == schema, name
