"""`tpumarket provider ask | asks` with the README's own provider.toml, on a lagging chain.

The README's config names no device class (the daemon asks in its devices' class): `provider
ask` with it, as printed, asks in this host's class. The chain here is a fresh anvil whose
blocks are an hour behind the host's clock (an idle chain's last block lags the same way): the
ask's expiry and `provider asks`'s "expires in" are judged by the later of the two clocks, as
the rest of the code judges expiries.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.chain import ANVIL_BINARY, DEV_MNEMONIC, Anvil, dev_keys, free_port
from contracts.messages import address_of
from provider.cli import main
from services.lifetime import dies_with_parent
from tests.contracts.conftest import World, deploy_world
from tests.market.server import market_server

ROOT = Path(__file__).resolve().parents[2]
LAG_S = 3_600


def _readme_config() -> str:
    """Return the provider.toml the README prints (between its heredoc markers)."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"cat > provider.toml <<'TOML'\n(.*?)\nTOML\n", text, re.S)
    assert match is not None, "the README prints no provider.toml"
    return match.group(1) + "\n"


@pytest.fixture(scope="module")
def lagging() -> Iterator[World]:
    """A fresh deployment on an anvil whose clock runs an hour behind the host's."""
    port = free_port()
    args = [str(ANVIL_BINARY), "--host", "127.0.0.1", "--port", str(port), "--accounts", "10"]
    args += ["--mnemonic", DEV_MNEMONIC, "--silent", "--timestamp", str(int(time.time()) - LAG_S)]
    process = subprocess.Popen(
        dies_with_parent(args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    anvil = Anvil(port=port, chain_id=31337, process=process, keys=dev_keys(10))
    try:
        anvil._wait_ready()
        yield deploy_world(anvil)
    finally:
        anvil.stop()


def test_the_readme_config_asks_as_printed_and_expiries_follow_the_later_clock(
    lagging: World,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    world = lagging
    assert world.anvil.latest_timestamp() < time.time() - LAG_S / 2  # the chain lags
    provider, arbiter = world.providers[0], world.arbiter
    data = tmp_path / "market"
    data.mkdir()
    chain = ["--rpc-url", world.anvil.url, "--escrow", world.escrow.address]
    with market_server(data, *chain, "--chain-id", "31337") as market:
        for name, value in {
            "PRIVATE_KEY": provider,
            "RPC_URL": world.anvil.url,
            "ESCROW": world.escrow.address,
            "MARKET_URL": market,
            "ASK_ARBITER": address_of(arbiter),
        }.items():  # what `chain up` exports, as the README says
            monkeypatch.setenv(f"TPUMARKET_PROVIDER_{name}", value)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "provider.toml").write_text(_readme_config())
        config = ["--config", "provider.toml"]
        assert main(["stake", "5", *config]) == 0
        capsys.readouterr()

        assert main(["ask", *config, "--json"]) == 0  # was: "[ask] names no device_class"
        out, err = capsys.readouterr()
        posted = json.loads(out.strip().splitlines()[-1])
        assert posted["device_class"] == "cpu" and posted["state"] == "open"
        assert "asking in this host's class cpu" in err
        assert posted["expiry"] >= time.time() + 1_800 - 60  # the config's expiry_s from now

        assert main(["asks", *config]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if " cpu " in line)
        expires_in = int(row.split()[-2])
        assert 1_800 - 120 <= expires_in <= 1_800  # not an hour more, as the last block says
