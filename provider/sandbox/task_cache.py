"""JAX's persistent compilation cache inside a worker, fed per task by the daemon (child only).

The worker mounts no cache directory. For one task it reads only the entries the daemon sent
with the request (the requesting client's, for that program) and collects what it compiles;
the daemon stores those under the same client. Nothing is read from or written to disk.
"""

from __future__ import annotations

from typing import Any

NO_DIRECTORY = "/nonexistent/tpumarket-daemon-held-cache"
"""Set as JAX's cache directory so the cache counts as enabled; never opened."""


class TaskCache:
    """The entries of the task in progress; inactive (no reads, no writes) between tasks."""

    def __init__(self) -> None:
        """Start inactive and empty."""
        self.active = False
        self.entries: dict[str, bytes] = {}
        self.new: dict[str, bytes] = {}

    def begin(self, entries: dict[str, bytes]) -> None:
        """Serve ``entries`` and collect new ones for one task."""
        self.active, self.entries, self.new = True, dict(entries), {}

    def end(self) -> dict[str, bytes]:
        """Stop serving; return what the task compiled."""
        new, self.active, self.entries, self.new = self.new, False, {}, {}
        return new

    def get(self, key: str) -> bytes | None:
        """The entry under ``key`` for the task in progress, if the daemon sent it."""
        return self.entries.get(key) if self.active else None

    def put(self, key: str, value: bytes) -> None:
        """Collect a compiled entry for the daemon (dropped between tasks)."""
        if self.active:
            self.new[key] = value


def install(jax: Any, cache: TaskCache) -> None:
    """Make ``cache`` JAX's persistent compilation cache in this process."""
    from jax._src import compilation_cache
    from jax._src.compilation_cache_interface import CacheInterface

    class _Adapter(CacheInterface):
        _path: Any = None

        def get(self, key: str) -> bytes | None:
            return cache.get(key)

        def put(self, key: str, value: bytes) -> None:
            cache.put(key, value)

        def clear(self) -> None:
            cache.entries.clear()

    jax.config.update("jax_compilation_cache_dir", NO_DIRECTORY)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    with compilation_cache._cache_initialized_mutex:
        compilation_cache._cache = _Adapter()
        compilation_cache._cache_initialized = True


def attach_entries(reply: Any, body: bytes, new: dict[str, bytes]) -> bytes:
    """List ``new`` entries in ``reply`` (a reply header); append them to ``body``."""
    if not new:
        return body
    reply["cache_put"] = [[key, len(value)] for key, value in new.items()]
    return body + b"".join(new.values())
