"""Attack 9 of ``scripts/abuse``: the victim's task request rebuilt from a claim's calldata.

The provider claims the victim's delivered task on chain (as its claim job does for a silent
client); the attacker reads the ``claimReceipts`` transaction from the node, decodes it with the
escrow's ABI, rebuilds the ``TaskRequest`` and its signature, and posts them to the daemon, with
and without ``wait``. ``results_read_by_stranger`` counts the answers that carried any of the
result: a receipt, outputs, a report, a diagnosis or an access token.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eth_typing import HexStr

from contracts.errors import EscrowError
from contracts.messages import Claim, Receipt, TaskRequest
from scripts.abuse_attacks import Tally, client
from scripts.abuse_world import PLAN, World

RESULT_FIELDS = ("receipt", "outputs_b64", "outputs_size", "report", "diagnosis", "access_token")


def _claimed(world: World) -> tuple[str, list[tuple[TaskRequest, bytes]]]:
    """Claim the victim's task as the provider; return how, and what its calldata holds."""
    victim = world.victim
    assert victim.task is not None
    escrow = world.st.escrow
    receipt = Receipt.from_json(victim.answer["receipt"])
    claim = Claim(receipt, victim.task.max_price, victim.signature)
    try:
        result = escrow.claim_receipts(world.provider.key, victim.deal_id, PLAN, [claim])
        calldata = bytes(escrow.tx.w3.eth.get_transaction(HexStr(result.tx_hash))["input"])
        how = "on_chain"
    except EscrowError:  # the chain refused the claim: the same calldata, not mined
        calldata = bytes.fromhex(
            escrow.contract.encode_abi(
                "claimReceipts", args=[victim.deal_id, PLAN.as_args(), [claim.as_args()]]
            ).removeprefix("0x")
        )
        how = "encoded"
    function, args = escrow.contract.decode_function_input(calldata)
    assert function.fn_name == "claimReceipts"
    names = [f.name for f in dataclasses.fields(Receipt)]
    found = []
    for item in args["claims"]:
        fields = item["receipt"] if isinstance(item, dict) else item[0]
        values = (
            list(fields) if not isinstance(fields, dict) else [fields[_camel(n)] for n in names]
        )
        rebuilt = Receipt(**{n: _plain(v) for n, v in zip(names, values, strict=True)})
        max_price = item["maxPrice"] if isinstance(item, dict) else item[1]
        signature = item["requestSignature"] if isinstance(item, dict) else item[2]
        found.append((rebuilt.request(int(max_price)), bytes(signature)))
    return how, found


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytes, bytearray)) else value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def claimed_replay(world: World, tally: Tally) -> dict[str, Any]:
    """Replay the requests a claim published, as a stranger; count what came back."""
    how, published = _claimed(world)
    victim = world.victim
    answer = victim.answer
    secrets = [
        str(answer.get("receipt_signature", "")).removeprefix("0x"),
        str(answer.get("access_token", "")),
        str(answer.get("outputs_b64") or "")[:40],
    ]
    secrets = [s for s in secrets if len(s) >= 16]
    statuses = []
    with client(world.daemon, "127.0.0.3", timeout=120) as http:
        for request, signature in published:
            for wait in (0, 30):
                headers = world.task_headers(request, signature)
                reply = http.post("/v1/tasks", headers=headers, params={"wait": wait})
                statuses.append(reply.status_code)
                tally.calls += 1
                tally.scan(reply, f"claimed replay (wait {wait})")
                body = (
                    reply.json()
                    if reply.headers.get("content-type", "").startswith("application/json")
                    else {}
                )
                leaked = [name for name in RESULT_FIELDS if body.get(name)]
                if leaked or any(s in reply.text for s in secrets):
                    tally.results_read_by_stranger += 1
                    tally.leaks.append(
                        f"claimed replay (wait {wait}): {reply.status_code} {leaked}"
                    )
                if reply.status_code >= 500:
                    tally.server_errors += 1
    return {"claim": how, "requests_rebuilt": len(published), "statuses": statuses}
