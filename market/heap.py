"""The server's heap and the cyclic garbage collector.

A full collection scans every tracked object; a market server holds several hundred thousand
from its imports alone (the web framework, the chain libraries, the ORM), so a full collection
paused the event loop and the writer for up to ~165 ms under load, which is what the slowest
single orders waited for. What the process built before serving (imports, the restored books,
the app) is moved out of the collector's scans once, at start (`settle`): later collections
scan only what serving created. Objects moved out are still freed when their last reference
goes; only a reference cycle among them would stay, and start-up builds none that serving
drops. The count moved out is the `market_heap_frozen_objects` gauge.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect what start-up left unreachable, then move every surviving object out of the
    collector's scans; return how many objects were moved out."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
