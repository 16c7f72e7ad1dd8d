"""``tpumarket provider verify-journal``: check a whole journal, streamed, in constant memory.

Every deal's receipt chain (links, hashes, signatures), every sealed deal's rows against the
checkpoint its seal signed, every stored blob against its hash, every kept output against its
receipt's hash. It opens the journal read-only
and takes no lock: it runs beside a live daemon (SQLite's WAL gives it a consistent view of
each deal). The provider and escrow domain come from the journal's meta (written by the
daemon at every open); ``--provider`` (or the config's key) names the provider it must be.
Exit 0 when everything verifies, 1 when something does not (each problem printed), 2 when the
journal cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from contracts.messages import Domain, address_of
from provider.errors import ProviderError
from provider.journal.schema import SCHEMA_VERSION
from provider.journal.store import DOMAIN_META
from provider.journal.verification import (
    VerifyReport,
    verify_blobs,
    verify_deals,
    verify_task_data,
)

JOURNAL_FILE = "journal.sqlite3"


def register(actions: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``tpumarket provider verify-journal``."""
    verify = actions.add_parser(
        "verify-journal",
        help="check every receipt chain and every sealed deal of the journal (streamed)",
    )
    verify.add_argument("--config", default=None, help="the daemon's TOML file (its data_dir)")
    verify.add_argument("--journal", type=Path, default=None, help="the journal file itself")
    verify.add_argument("--provider", default=None, help="the provider address it must be")
    verify.add_argument("--quiet", action="store_true", help="no progress on stderr")
    verify.set_defaults(handler=_verify)


def _locate(args: argparse.Namespace) -> tuple[Path, str | None]:
    if args.journal is not None and args.provider is not None:
        return Path(args.journal), str(args.provider)
    from provider.operator import config_from

    config = config_from(args)
    path = args.journal or config.data_dir / JOURNAL_FILE
    return Path(path), args.provider or address_of(config.private_key)


def verify_journal(path: Path, provider: str | None, *, quiet: bool = True) -> VerifyReport:
    """Verify the journal at ``path`` read-only; raise :class:`ProviderError` if unreadable."""
    if not path.is_file():
        raise ProviderError(f"no journal at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise ProviderError(
                f"the journal has schema version {version}, this command reads "
                f"{SCHEMA_VERSION}: start the daemon once to migrate it"
            )
        row = db.execute("SELECT value FROM meta WHERE key = ?", (DOMAIN_META,)).fetchone()
        if row is None:
            raise ProviderError("the journal names no escrow domain: start the daemon once")
        meta = json.loads(row[0])
        domain = Domain(
            chain_id=int(meta["chain_id"]),
            verifying_contract=str(meta["escrow"]),
            name=str(meta["name"]),
            version=str(meta["version"]),
        )
        expected = provider or str(meta["provider"])
        total = int(db.execute("SELECT COUNT(*) FROM deals").fetchone()[0])

        def progress(report: VerifyReport) -> None:
            if not quiet and (report.deals % 1000 == 0 or report.deals == total):
                print(f"{report.deals}/{total} deals checked", file=sys.stderr, flush=True)

        report = verify_deals(db, expected, domain, progress=progress)
        verify_blobs(db, report)
        verify_task_data(db, report)
        if str(meta["provider"]).lower() != expected.lower():
            report.problems.append(
                f"the journal was opened for provider {meta['provider']}, not {expected}"
            )
        return report
    except (sqlite3.Error, ValueError, KeyError) as exc:
        raise ProviderError(f"cannot read the journal at {path}: {exc}") from exc
    finally:
        db.close()


def _verify(args: argparse.Namespace) -> int:
    try:
        path, provider = _locate(args)
        report = verify_journal(path, provider, quiet=args.quiet)
    except ProviderError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps({"journal": str(path), **report.to_json()}), flush=True)
    return 0 if report.ok else 1
