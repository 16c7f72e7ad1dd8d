"""Signed orders: place one, place a batch, cancel, look up."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool
from starlette.convertors import StringConvertor, register_url_convertor

from market.api.batch_checks import precheck_batch
from market.api.body import JsonBody, Parsed, batch_limits, json_body, order_limits, small_limits
from market.api.deps import ServiceDep
from market.models import (
    ADDRESS,
    BYTES32,
    LABEL,
    BatchResult,
    CancelCreate,
    OrderBatch,
    OrderCreate,
    OrderPublic,
    PlaceResult,
)

router = APIRouter(prefix="/v1/orders", tags=["orders"])


class OrderIdSegment(StringConvertor):
    """One path segment that is not the name of a sibling route (``batch``, ``cancel``).

    Without it ``GET /v1/orders/batch`` matched ``GET /v1/orders/{order_id}`` and answered 422
    for a malformed id; now the path belongs to the POST route alone, so the answer is 405 with
    ``Allow: POST``. Any other segment still reaches the route and its id pattern (422)."""

    regex = "(?!(?:batch|cancel)$)[^/]+"


register_url_convertor("order_id", OrderIdSegment())


# Every body is read within its route's limits and validated in one step (`market.api.body`);
# the body schemas are published all the same. The placement routes are `async def`: verifying
# one order on the event loop costs less than a hop to a worker thread and back, a batch is
# verified in a worker thread (`MarketService.place_batch_async`), and the commit is awaited.

OrderBody = Annotated[Parsed[OrderCreate], Depends(JsonBody(OrderCreate, order_limits))]
BatchBody = Annotated[Parsed[OrderBatch], Depends(JsonBody(OrderBatch, batch_limits))]
CancelBody = Annotated[Parsed[CancelCreate], Depends(JsonBody(CancelCreate, small_limits))]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PlaceResult,
    openapi_extra=json_body(OrderCreate),
)
async def place_order(body: OrderBody, service: ServiceDep) -> Response:
    """Place one signed ask or bid (`OrderCreate`); answer after it is matched and stored."""
    result = (await service.place_async([body.model]))[0]
    return _json(result.model_dump_json())


@router.post(
    "/batch",
    status_code=status.HTTP_201_CREATED,
    response_model=BatchResult,
    openapi_extra=json_body(OrderBatch),
)
async def place_batch(request: Request, body: BatchBody, service: ServiceDep) -> Response:
    """Place several signed orders (`OrderBatch`) atomically (all or none), in the given order.

    A batch costs its caller's IP bucket one token per order."""
    orders = body.model.orders
    caller = request.client.host if request.client else "unknown"
    precheck_batch(service, orders, caller)  # what needs no signature recovery, first
    result = BatchResult.model_construct(results=await service.place_batch_async(orders))
    return _json(result.model_dump_json())


def _json(body: str) -> Response:
    # The model is already validated: serialize once instead of FastAPI's dump-validate-dump.
    return Response(body, status_code=201, media_type="application/json")


@router.post("/cancel", openapi_extra=json_body(CancelCreate))
async def cancel_order(body: CancelBody, service: ServiceDep) -> OrderPublic:
    """Cancel a live order on its owner's signed `CancelOrder`."""
    return await run_in_threadpool(service.cancel, body.model)


@router.get("")
def list_orders(
    service: ServiceDep,
    owner: Annotated[str | None, Query(pattern=ADDRESS)] = None,
    device_class: Annotated[str | None, Query(pattern=LABEL)] = None,
    live: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[OrderPublic]:
    """List orders, newest first."""
    return service.orders(owner=owner, device_class=device_class, live_only=live, limit=limit)


@router.get("/{order_id:order_id}")
def get_order(order_id: Annotated[str, Path(pattern=BYTES32)], service: ServiceDep) -> OrderPublic:
    """Return one order by id (its EIP-712 digest)."""
    return service.order(order_id)
