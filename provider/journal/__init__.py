"""The provider's crash-safe receipt journal (see :mod:`provider.journal.store`).

- :mod:`~provider.journal.records`: the records and the per-deal book (pure);
- :mod:`~provider.journal.schema`: tables, triggers, migrations;
- :mod:`~provider.journal.rows`, :mod:`~provider.journal.envelopes`: rows read and written;
- :mod:`~provider.journal.verification`: receipt chains and seals checked, in memory or
  streamed;
- :mod:`~provider.journal.sealing`: closed and settled deals sealed under a signed checkpoint;
- :mod:`~provider.journal.retention`: each task's envelope and outputs pruned once settled;
- :mod:`~provider.journal.store`: :class:`Journal`, the one entry point.
"""

from provider.journal.records import (
    PROTOCOL,
    AckRecord,
    DealBook,
    Key,
    QuoteRecord,
    ReceiptRecord,
    SettlementRecord,
    VoucherRecord,
)
from provider.journal.retention import OutputsPrunedError, releasable
from provider.journal.schema import SCHEMA_VERSION
from provider.journal.store import Journal
from provider.journal.verification import VerifyReport

__all__ = [
    "PROTOCOL",
    "SCHEMA_VERSION",
    "AckRecord",
    "DealBook",
    "Journal",
    "Key",
    "OutputsPrunedError",
    "QuoteRecord",
    "ReceiptRecord",
    "SettlementRecord",
    "VerifyReport",
    "VoucherRecord",
    "releasable",
]
