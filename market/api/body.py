"""Request bodies read as raw bytes and validated in one step, with the schema kept published.

FastAPI would decode the JSON into Python objects, then validate those; the placement routes
validate the bytes directly (`model_validate_json`), about twice as fast, and raise the same
`RequestValidationError` (422 with the failing fields) FastAPI would. `json_body` and
`publish_schemas` keep the request body in the OpenAPI document, so clients and schema-driven
tests see exactly what FastAPI would have published.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
_REF = "#/components/schemas/{model}"


async def raw_body(request: Request) -> bytes:
    """Return the request's body bytes (the size limit middleware has counted them)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body against `model`; raise `RequestValidationError` (422) if it fails."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [_in_body(error) for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _in_body(error: Any) -> dict[str, Any]:
    """Return a pydantic error located in the body, its input printable (bytes may not be
    UTF-8)."""
    located: dict[str, Any] = {**error, "loc": ("body", *error["loc"])}
    if isinstance(located.get("input"), bytes):
        located["input"] = located["input"].decode("utf-8", "replace")
    return located


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """Return the `openapi_extra` that documents a route's JSON body as `model`."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def publish_schemas(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add `models` (and the models they use) to the app's OpenAPI components."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            if model.__name__ not in components:
                definition = model.model_json_schema(ref_template=_REF)
                for name, sub in definition.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components[model.__name__] = definition
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
