"""The client SDK's exception root and its families."""

from __future__ import annotations


class ClientError(Exception):
    """Root of every error raised by the `client` package."""


class DeliveryRejected(ClientError, ValueError):
    """A provider's delivery failed verification and must not be paid."""

    def __init__(self, task_index: int, reason: str) -> None:
        self.task_index = task_index
        self.reason = reason
        super().__init__(f"task {task_index}: {reason}")


class SpendingCapExceeded(ClientError):
    """Paying would take a deal or the client past its spending cap."""


class DealMismatch(ClientError, ValueError):
    """A market deal cannot be opened by this client: not its deal, no quote, or a bad quote."""


class ModelExportError(ClientError, ValueError):
    """A model could not be exported into a task program (bad example arguments, tracing)."""


class ModelConversionError(ModelExportError):
    """A PyTorch module could not be converted to JAX (torch.export, torchax or torch_xla)."""


class ConverterUnavailableError(ClientError, ImportError):
    """An optional converter or model source (torch, torchax, torch_xla, onnx) is missing."""


class ClientInputError(ClientError, ValueError):
    """The caller's own input is wrong (a file, a tensor, an id): the CLI exits 2."""


class ProgramInputsError(ClientInputError):
    """Inputs do not match an exported program's signature (count, shape, dtype, batch)."""


class ProgramOutputsError(ClientError, ValueError):
    """Delivered outputs cannot be decoded or do not match the program's signature."""


class ProviderUnavailable(ClientError, ConnectionError):
    """The provider could not be reached, after retrying transient network errors."""


class ProviderRejected(ClientError):
    """The provider answered a request with an error status and a reason."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        self.status = status
        self.error = error
        self.reason = reason
        super().__init__(f"{status} {error}: {reason}")
