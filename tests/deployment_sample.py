"""A deployment file's contents for settings tests (no chain is read: the addresses and code
hashes are well-formed, not deployed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLE: dict[str, Any] = {
    "format": 1,
    "chain_id": 8453,
    "token": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
    "escrow": "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512",
    "deployer": "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
    "deployment_block": 77,
    "min_challenge_window": 600,
    "arbitration_period": 604800,
    "escrow_code": "0x" + "ab" * 32,
    "token_code": "existing",
}


def write_sample(path: Path, **changes: Any) -> Path:
    """Write the sample (with `changes`) to `path`; return the path."""
    path.write_text(json.dumps({**SAMPLE, **changes}))
    return path
