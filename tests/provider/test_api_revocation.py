"""A deal's client revokes its result access tokens, and the revocation outlives a restart.

Real HTTP against the daemon run from its CLI on anvil: a task is submitted and its access token
reads the result; the client's signed revocation (``POST /v1/deals/{id}/access/revoke``) makes
that token useless, while a fresh signature still reads and a task acked after the revocation
gets a token that works. A stranger's revocation, or one whose cut-off is far from now, is
refused. The daemon is stopped and started again on the same data dir: the old token stays
refused.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from contracts.access import ACCESS_TOKEN_HEADER, result_access_digest
from contracts.messages import sign_digest
from provider.access import REVOCATIONS_FILE, REVOKE_SCOPE, REVOKE_SKEW_S
from tests.provider.access_support import proof
from tests.provider.daemon_support import (
    ChainWorld,
    SignedTask,
    served_daemon,
    sign_task,
    tiny_mlp_envelope,
)


def _revocation(world: ChainWorld, key: str, deal_id: int, before: int) -> dict[str, object]:
    digest = result_access_digest(world.domain, deal_id, REVOKE_SCOPE, before)
    return {"before": before, "signature": "0x" + sign_digest(digest, key).hex()}


def _submit(http: httpx.Client, task: SignedTask) -> str:
    """Submit ``task``, wait for its result; return its access token."""
    reply = http.post("/v1/tasks", content=task.body, headers=task.headers(), params={"wait": 60})
    assert reply.status_code == 200, reply.text[:500]
    body = reply.json()
    assert body["receipt"] is not None
    return str(body["access_token"])


def _read(http: httpx.Client, deal_id: int, index: int, headers: dict[str, str]) -> httpx.Response:
    return http.get(f"/v1/tasks/{deal_id}/{index}", headers=headers)


def test_revocation_when_signed_by_the_client_then_old_tokens_refused_even_after_restart(
    chain_world: ChainWorld, tmp_path: Path
) -> None:
    world = chain_world
    deal_id = world.open_deal()
    envelope, _ = tiny_mlp_envelope()

    with (
        served_daemon(world, tmp_path) as daemon,
        httpx.Client(base_url=daemon.url, timeout=120) as http,
    ):
        token = _submit(http, sign_task(world, world.client, deal_id, 0, envelope))
        assert _read(http, deal_id, 0, {ACCESS_TOKEN_HEADER: token}).status_code == 200

        now = int(time.time())
        revoke = f"/v1/deals/{deal_id}/access/revoke"
        stranger = http.post(revoke, json=_revocation(world, world.other_client, deal_id, now))
        stale = http.post(
            revoke, json=_revocation(world, world.client, deal_id, now - 2 * REVOKE_SKEW_S)
        )
        assert (stranger.status_code, stale.status_code) == (403, 403), (stranger.text, stale.text)
        assert _read(http, deal_id, 0, {ACCESS_TOKEN_HEADER: token}).status_code == 200

        done = http.post(revoke, json=_revocation(world, world.client, deal_id, now))
        assert done.status_code == 200, done.text
        assert done.json() == {"deal_id": deal_id, "revoked_through": now}
        # An older cut-off, replayed or new, moves nothing back.
        older = http.post(revoke, json=_revocation(world, world.client, deal_id, now - 5))
        assert older.json()["revoked_through"] == now

        refused = _read(http, deal_id, 0, {ACCESS_TOKEN_HEADER: token})
        assert refused.status_code == 403 and "revoked" in refused.json()["reason"]
        signed = _read(http, deal_id, 0, proof(world, world.client, deal_id, 0))
        assert signed.status_code == 200 and signed.json()["receipt"] is not None

        # Acked after the cut-off: its token works.
        later = _submit(http, sign_task(world, world.client, deal_id, 1, envelope))
        assert _read(http, deal_id, 1, {ACCESS_TOKEN_HEADER: later}).status_code == 200

    assert (tmp_path / "data" / REVOCATIONS_FILE).exists()
    with (
        served_daemon(world, tmp_path) as daemon,
        httpx.Client(base_url=daemon.url, timeout=120) as http,
    ):
        after = _read(http, deal_id, 0, {ACCESS_TOKEN_HEADER: token})
        kept = _read(http, deal_id, 1, {ACCESS_TOKEN_HEADER: later})
    assert after.status_code == 403 and "revoked" in after.json()["reason"]
    assert kept.status_code == 200
