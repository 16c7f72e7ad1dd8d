"""The ``[storage]`` section of the daemon's config: bounds on uploads and kept task data.

See :mod:`provider.storage_bounds` for how each bound is applied.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import NonNegativeInt, PositiveInt

from provider.config_sections import Section

MIB = 1024 * 1024


class StorageConfig(Section):
    """Bounds on what tasks upload and what the journal keeps of them (``[storage]``;
    ``TPUMARKET_PROVIDER_STORAGE_<KEY>``).

    A deal keeps at most ``deal_max_bytes`` of unsettled task data (envelopes as uploaded and
    outputs), the provider ``total_max_bytes`` over all deals; a task uploads at most
    ``upload_base_bytes + price * upload_bytes_per_unit`` bytes (its ack's price, base units).
    """

    SECTION: ClassVar[str] = "storage"

    deal_max_bytes: PositiveInt = 4 * 1024 * MIB
    total_max_bytes: PositiveInt = 64 * 1024 * MIB
    upload_base_bytes: NonNegativeInt = 16 * MIB
    upload_bytes_per_unit: NonNegativeInt = 65_536
