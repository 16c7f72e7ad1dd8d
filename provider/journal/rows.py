"""Rows of the journal's tables read back as records, and a deal's book read from them."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from contracts.messages import Quote, Receipt, Voucher
from provider.journal.records import (
    AckRecord,
    DealBook,
    QuoteRecord,
    ReceiptRecord,
    SettlementRecord,
    VoucherRecord,
    ack_record,
)
from provider.lifecycle import SettlementAction

ACK_COLUMNS = (
    "request_json, request_sig, request_hash, target, ack_json, ack_sig, acked_at, protocol"
)
RECEIPT_COLUMNS = "seq, receipt_json, receipt_sig, receipt_hash, detail_json"
VOUCHER_COLUMNS = "seq, deal_id, voucher_json, signature, received_at"
SETTLEMENT_COLUMNS = "seq, deal_id, action, data_json, tx_hash, recorded_at"
QUOTE_COLUMNS = "seq, market_deal_id, quote_json, signature, signed_at"


def ack_of_row(row: tuple[Any, ...]) -> AckRecord:
    """Return the record of an ``ACK_COLUMNS`` row."""
    req, req_sig, req_hash, target, ack, ack_sig, acked_at, protocol = row
    return ack_record(
        json.loads(req),
        bytes(req_sig),
        bytes(req_hash),
        target,
        json.loads(ack),
        bytes(ack_sig),
        float(acked_at),
        int(protocol),
    )


def receipt_of_row(row: tuple[Any, ...]) -> ReceiptRecord:
    """Return the record of a ``RECEIPT_COLUMNS`` row."""
    seq, receipt_json, sig, receipt_hash, detail = row
    return ReceiptRecord(
        receipt=Receipt.from_json(json.loads(receipt_json)),
        signature=bytes(sig),
        receipt_hash=bytes(receipt_hash),
        detail=json.loads(detail),
        seq=int(seq),
    )


def voucher_of_row(row: tuple[Any, ...]) -> VoucherRecord:
    """Return the record of a ``VOUCHER_COLUMNS`` row."""
    seq, _, voucher_json, sig, received_at = row
    return VoucherRecord(
        voucher=Voucher.from_json(json.loads(voucher_json)),
        signature=bytes(sig),
        received_at=float(received_at),
        seq=int(seq),
    )


def settlement_of_row(row: tuple[Any, ...]) -> SettlementRecord:
    """Return the record of a ``SETTLEMENT_COLUMNS`` row."""
    seq, deal, action, data, tx_hash, at = row
    return SettlementRecord(
        int(deal), SettlementAction(action), json.loads(data), tx_hash, float(at), int(seq)
    )


def quote_of_row(row: tuple[Any, ...]) -> QuoteRecord:
    """Return the record of a ``QUOTE_COLUMNS`` row."""
    seq, deal_key, quote_json, sig, signed_at = row
    return QuoteRecord(
        str(deal_key),
        Quote.from_json(json.loads(quote_json)),
        bytes(sig),
        float(signed_at),
        int(seq),
    )


def read_book(db: sqlite3.Connection, deal_id: int, *, sealed: bool) -> DealBook:
    """Read a deal's rows into a book (no verification)."""
    deal = str(deal_id)
    book = DealBook({}, {}, [], [], sealed=sealed)
    for row in db.execute(
        f"SELECT {ACK_COLUMNS} FROM acks WHERE deal_id = ? ORDER BY acked_at", (deal,)
    ):
        ack = ack_of_row(row)
        book.acks[ack.ack.task_index] = ack
        book.ack_total += ack.ack.price
    for row in db.execute(
        f"SELECT {RECEIPT_COLUMNS} FROM receipts WHERE deal_id = ? ORDER BY seq", (deal,)
    ):
        receipt = receipt_of_row(row)
        book.receipts[receipt.receipt.task_index] = receipt
        book.last_receipt_hash = receipt.receipt_hash
    book.vouchers = [
        voucher_of_row(row)
        for row in db.execute(
            f"SELECT {VOUCHER_COLUMNS} FROM vouchers WHERE deal_id = ? ORDER BY seq", (deal,)
        )
    ]
    book.settlements = [
        settlement_of_row(row)
        for row in db.execute(
            f"SELECT {SETTLEMENT_COLUMNS} FROM settlements WHERE deal_id = ? ORDER BY seq",
            (deal,),
        )
    ]
    book.pruned = {
        int(row[0])
        for row in db.execute("SELECT task_index FROM pruned WHERE deal_id = ?", (deal,))
    }
    return book
