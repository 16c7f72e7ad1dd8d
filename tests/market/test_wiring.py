"""Process wiring: the command line, the scheduled jobs, the static page."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastapi.testclient import TestClient

from market.api.app import create_app
from market.cli import register, settings_from_args
from market.indexer import Indexer
from market.service import MarketService
from market.settings import Settings

from .signing import CHAIN_ID, ESCROW


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tpumarket")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_serve_when_flags_given_then_settings_follow(tmp_path: Path) -> None:
    args = _parse(
        ["market", "serve", "--data-dir", str(tmp_path), "--escrow", ESCROW, "--chain-id", "7",
         "--rpc-url", "http://127.0.0.1:1", "--no-jobs", "--rate-per-ip", "0"]
    )  # fmt: skip
    settings = settings_from_args(args)
    assert (settings.data_dir, settings.escrow, settings.chain_id) == (tmp_path, ESCROW, 7)
    assert settings.rpc_url == "http://127.0.0.1:1" and not settings.run_jobs
    assert settings.rate_per_ip == 0
    assert (settings.index_from_block, settings.min_challenge_window) == (None, 1)
    pinned = settings_from_args(
        _parse(["market", "serve", "--from-block", "42", "--min-challenge-window", "90"])
    )
    assert (pinned.index_from_block, pinned.min_challenge_window) == (42, 90)


def test_app_when_jobs_enabled_then_expire_offline_rematch_and_index_are_scheduled(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        chain_id=CHAIN_ID,
        escrow=ESCROW,
        rpc_url="http://127.0.0.1:1",  # nobody there: the index job just records the failure
        run_jobs=True,
    )
    service = MarketService(settings)
    app = create_app(service=service)
    with TestClient(app) as client:
        jobs = {job.id for job in app.state.scheduler.get_jobs()}
        assert jobs == {"expire", "offline", "bidders", "rematch", "index"}
        assert isinstance(app.state.indexer, Indexer)
        page = client.get("/")
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert client.get("/static/app.js").status_code == 200
    assert not app.state.scheduler.running
    service.close()
