"""The whole market end to end on a local chain: what `make demo` and `tpumarket demo` run.

One command, embedded defaults: start anvil, deploy the token and the escrow, start the market
(SQLite, with its chain indexer) and two provider daemons as subprocesses, each with its own
data dir, port and price. Provider "alpha" is dearer and keeps a generous SLO; provider "beta"
is cheaper but promises a 1 s SLO on one worker, which it cannot keep. Their operators stake
and post signed asks with signed quotes. A funded client bids, is matched against both asks,
opens both deals on chain with the providers' quotes and runs a real workload:

- TPU v5e compile-checks (target ``v5e:1x1``) on alpha: the Silero VAD model (fits) and an
  oversized dense layer (runs out of HBM: diagnosed ``oom`` with required vs available bytes);
- batches of Silero VAD inference (a real trained model from the ``silero-vad`` wheel) on
  both providers.

Every delivery is verified before it is paid; each verified delivery is paid at once by the
client's next cumulative voucher for its deal, which the provider's settlement job redeems (no
provider needs to claim: the client never stops paying); beta's late tasks are refunded on
chain with the penalty; the client agrees to close both deals and each provider's job closes
its own. The tables (per task, per deal as the chain holds it) and the figures end the run
(``--json``: one JSON line).

The client side uses only the client SDK and ``contracts``; the market and the providers are
started by module name (``python -m market.cli``, ``python -m provider.cli``).

Modules: ``terms`` (amounts, timeouts, the providers' terms), ``processes`` (the market and the
daemons), ``workload`` (the tasks), ``deals`` (asks, the bid, the deals and their runs),
``settlement`` (redemption, refunds, the close), ``summary`` (figures and table), ``text``
(how outcomes read), ``runner`` (the whole run), ``cli`` (the command line).
"""

from client.demo.cli import main, register
from client.demo.errors import DemoError
from client.demo.runner import DemoOptions, run
from client.demo.summary import Summary
from client.demo.terms import CLIENT_FUNDS

__all__ = ["CLIENT_FUNDS", "DemoError", "DemoOptions", "Summary", "main", "register", "run"]
