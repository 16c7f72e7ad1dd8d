"""Typed Python exceptions, one per custom error of the compiled contracts, with the same names.

Built at import from the error entries of the compiled ABIs (`contracts.abi.shipped_abis`:
the artifacts shipped in `contracts/artifacts`, tested to equal a fresh compile), so an
error added to or removed from the Solidity interface is added to or removed from Python with
no edit here. Each class subclasses `ContractRevert` (`error_name`, `error_args`) and bears the
error's name and signature: `from contracts.reverts import EscrowDealNotFound` and
`except EscrowDealNotFound` work as for a class written out by hand; a name the ABI lacks raises
ImportError (AttributeError) at once. The errors' meanings are their NatSpec in
`contracts/sol/interfaces/IComputeEscrow.sol`.
"""

from __future__ import annotations

from typing import Any

from contracts.abi import entries, shipped_abis, signature
from contracts.errors import ContractRevert


def _revert_class(item: dict[str, Any]) -> type[ContractRevert]:
    declared = ", ".join(f"{i['type']} {i['name']}".strip() for i in item["inputs"])
    return type(
        item["name"],
        (ContractRevert,),
        {
            "__doc__": f"Raised when a contract reverts with `{item['name']}({declared})`.",
            "__module__": __name__,
            "SIGNATURE": signature(item),
            "INPUTS": tuple(str(i["name"]) for i in item["inputs"]),
        },
    )


REVERTS: dict[str, type[ContractRevert]] = {
    name: _revert_class(item) for name, item in sorted(entries(shipped_abis(), "error").items())
}
"""Every custom error of the compiled contracts: its name -> its exception class."""


def __getattr__(name: str) -> type[ContractRevert]:
    try:
        return REVERTS[name]
    except KeyError:
        raise AttributeError(f"no contract error is named {name}") from None


def __dir__() -> list[str]:
    return sorted([*globals(), *REVERTS])
