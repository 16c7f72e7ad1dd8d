"""A provider daemon that alters every successful inference output before it signs the receipt.

``python -m tests.client.lying_provider run --config FILE`` runs the real daemon
(``provider.cli``) with one change: the outputs it delivers, receipts, claims and hands to the
arbiter are the honest ones plus one in every element. Its receipts verify (they commit to what
it delivers), so only another replica or the arbiter's re-execution can tell it lies.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import provider.task_runner as task_runner
from programs.envelope import ArrayFormat, decode_arrays, encode_arrays
from provider.cli import main
from provider.sandbox.results import InferenceResult

honest = getattr(task_runner, "delivery")  # noqa: B009


def altered(outputs: bytes) -> bytes:
    """Return the outputs with one added to every element (dtypes and shapes kept)."""
    arrays = decode_arrays(outputs, ArrayFormat.SAFETENSORS)
    return encode_arrays(
        {k: (np.asarray(v) + 1).astype(np.asarray(v).dtype) for k, v in arrays.items()}
    )


def lying_delivery(outcome: Any) -> Any:
    outputs, detail, status, *rest = honest(outcome)
    if isinstance(outcome, InferenceResult) and outputs:
        outputs = altered(outputs)
    return (outputs, detail, status, *rest)


setattr(task_runner, "delivery", lying_delivery)  # noqa: B010

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
