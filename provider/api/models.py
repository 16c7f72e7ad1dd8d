"""Request and response schemas of the API, in one place."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from provider.journal import Journal, OutputsPrunedError
from provider.lifecycle import TaskState
from provider.service import TaskView

INLINE_OUTPUTS_MAX = 4 * 1024 * 1024
REQUEST_HEADER = "X-Tpumarket-Request"
SIGNATURE_HEADER = "X-Tpumarket-Signature"
TARGET_HEADER = "X-Tpumarket-Target"

DealId = Annotated[int, Path(ge=0, lt=2**256, description="the escrow's deal id (uint256)")]
TaskIndex = Annotated[int, Path(ge=0, lt=2**32, description="the task's index (uint32)")]


class TaskPublic(BaseModel):
    """A task as the client sees it: ack, then the signed receipt and what was delivered."""

    model_config = ConfigDict(frozen=True)

    deal_id: int
    task_index: int
    state: str = Field(description="acked | succeeded | failed")
    created: bool = Field(False, description="whether this call created the ack")
    ack: dict[str, Any]
    ack_signature: str
    receipt: dict[str, Any] | None = None
    receipt_signature: str | None = None
    receipt_hash: str | None = None
    outputs_size: int | None = None
    outputs_b64: str | None = Field(
        None, description="the outputs, when at most 4 MiB; else GET .../outputs"
    )
    outputs_released_after_settlement: bool = Field(
        False,
        description=(
            "true once the task was settled on chain and the provider released (pruned) its "
            "outputs: the state, receipt and report stay readable, the outputs do not "
            "(outputs_size and outputs_b64 are null; GET .../outputs answers 410 outputs_pruned)"
        ),
    )
    report: dict[str, Any] | None = Field(None, description="a compile task's report")
    diagnosis: dict[str, Any] | None = Field(None, description="a failed task's diagnosis")
    access_token: str | None = Field(
        None,
        description=(
            "proof of being the deal's client for result reads (X-Tpumarket-Access), in the "
            "answer that created the ack only; it expires at access_expires_at"
        ),
    )
    access_expires_at: int | None = Field(None, description="unix seconds: the token's expiry")


Token = tuple[str, int] | None
"""An access token and its expiry, or None: an answer that carries no token."""


def task_json(view: TaskView, journal: Journal, token: Token, *, created: bool = False) -> bytes:
    """Return a task's :class:`TaskPublic` JSON without pydantic (the hot path)."""
    data = task_dict(view, journal, token, created=created)
    return json.dumps(data, separators=(",", ":")).encode()


def ack_only_json(view: TaskView) -> bytes:
    """Return the answer to a repeated submission: the ack, nothing of the result.

    A signed request is public once a claim carries it, so its repeat proves nothing about
    who sends it: the answer holds what the ack's own signer gave out (the ack), the state
    ``acked`` whatever the task's progress, and no token; results need an access proof.
    """
    ack = view.ack
    data = {
        "deal_id": ack.ack.deal_id,
        "task_index": ack.ack.task_index,
        "state": str(TaskState.ACKED),
        "created": False,
        "ack": ack.ack_json(),
        "ack_signature": "0x" + ack.ack_sig.hex(),
    }
    return json.dumps(data, separators=(",", ":")).encode()


def task_dict(
    view: TaskView, journal: Journal, token: Token, *, created: bool = False
) -> dict[str, Any]:
    """Return the fields of :class:`TaskPublic` for a task."""
    ack = view.ack
    data: dict[str, Any] = {
        "deal_id": ack.ack.deal_id,
        "task_index": ack.ack.task_index,
        "state": view.state,
        "created": created,
        "ack": ack.ack_json(),
        "ack_signature": "0x" + ack.ack_sig.hex(),
    }
    if token is not None:
        data.update(access_token=token[0], access_expires_at=token[1])
    if view.receipt is not None:
        record = view.receipt
        data.update(
            receipt=record.receipt.to_json(),
            receipt_signature="0x" + record.signature.hex(),
            receipt_hash="0x" + record.receipt_hash.hex(),
            report=record.detail.get("report"),
            diagnosis=record.detail.get("diagnosis"),
        )
        try:
            outputs = view.outputs if view.outputs is not None else journal.outputs(ack.key)
        except OutputsPrunedError:  # settled on chain: the state stays, the outputs are gone
            data.update(outputs_size=None, outputs_b64=None)
            data["outputs_released_after_settlement"] = True
        else:
            data.update(
                outputs_size=len(outputs),
                outputs_b64=(
                    base64.b64encode(outputs).decode()
                    if len(outputs) <= INLINE_OUTPUTS_MAX
                    else None
                ),
                outputs_released_after_settlement=False,
            )
    return data


VOUCHER_FIELDS = frozenset({"deal_id", "cumulative_amount", "tasks"})
"""The keys of a voucher's JSON (``contracts.messages.Voucher.to_json``); no other is taken."""
MAX_VOUCHER_TASK_WORDS = 256
"""The most task bitmap words (``provider.voucher_desk.MAX_VOUCHER_WORDS``)."""


class VoucherIn(BaseModel):
    """A client-signed cumulative voucher.

    Its shape is checked before anything else, and the first fault ends the check: an unknown
    key (of the body or the voucher) or a bitmap of more than 256 words is refused with one
    error, before any field is validated, parsed or hashed and before any signature check.
    """

    model_config = ConfigDict(extra="forbid")

    voucher: dict[str, Any]
    signature: str = Field(max_length=200)

    @model_validator(mode="before")
    @classmethod
    def _shape_first(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        unknown = next((k for k in data if k not in ("voucher", "signature")), None)
        if unknown is not None:
            raise ValueError(f"unknown key {str(unknown)[:40]!r} ({len(data)} keys)")
        voucher = data.get("voucher")
        if isinstance(voucher, dict):
            unknown = next((k for k in voucher if k not in VOUCHER_FIELDS), None)
            if unknown is not None:
                raise ValueError(
                    f"voucher: unknown key {str(unknown)[:40]!r} ({len(voucher)} keys); "
                    f"a voucher has {', '.join(sorted(VOUCHER_FIELDS))}"
                )
            tasks = voucher.get("tasks")
            if isinstance(tasks, list) and len(tasks) > MAX_VOUCHER_TASK_WORDS:
                raise ValueError(
                    f"voucher: {len(tasks)} task bitmap words, at most {MAX_VOUCHER_TASK_WORDS}"
                )
        return data


class VoucherPublic(BaseModel):
    """An accepted voucher."""

    deal_id: int
    cumulative_amount: str
    tasks: list[int]
    new: bool


class DealPublic(BaseModel):
    """What the journal knows of a deal."""

    deal_id: int
    acked: int
    delivered: int
    receipted_amount: str
    vouched_amount: str
    redeemed_amount: str
    claimed_tasks: list[int]
    chain_head: str
    closed: bool
