"""Host memory shared by every worker: one ledger of reservations against the host's RAM.

Each worker alone sees its own address-space limit, so two programs that each fit alone
would both pass their worker's check. The parent therefore keeps one ledger for all of them,
against the host's physical memory (``MemTotal`` of ``/proc/meminfo`` times a fraction):

- a program whose need is known (it ran before for that client) reserves exactly that,
  waiting until the ledger has it free;
- a program not seen before is given an allowance, at most half of what is free now, which
  its worker's memory check uses instead of its own view; one that needs more fails that
  check with its need, waits until that much is free, and is tried once more.

So the reservations of the tasks in flight never add up past the host's budget. Thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass


def host_total_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The host's physical memory (``MemTotal``), or None where it cannot be read."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(eq=False)
class Reservation:
    """Bytes of host memory held for one task."""

    amount: int


class HostMemory:
    """A ledger of host memory reservations; ``budget_bytes`` in all."""

    def __init__(self, budget_bytes: int) -> None:
        """Reserve at most ``budget_bytes`` at once."""
        if budget_bytes <= 0:
            raise ValueError("the host memory budget must be positive")
        self.budget_bytes = budget_bytes
        self.reserved = 0
        self.peak = 0
        self.waits = 0
        self._waiting = 0
        self._cond = threading.Condition()

    @classmethod
    def of_host(cls, fraction: float = 0.8) -> HostMemory | None:
        """A ledger of ``fraction`` of this host's RAM (None where it is unknown)."""
        total = host_total_bytes()
        return None if total is None else cls(max(1, int(total * fraction)))

    @property
    def waiting(self) -> int:
        """How many tasks wait for memory now."""
        with self._cond:
            return self._waiting

    def fits(self, amount: int) -> bool:
        """Whether ``amount`` could ever be reserved (the host has that much at all)."""
        return amount <= self.budget_bytes

    def _take(self, amount: int) -> Reservation:
        self.reserved += amount
        self.peak = max(self.peak, self.reserved)
        return Reservation(amount)

    def allowance(self) -> Reservation:
        """Reserve half of what is free now (maybe 0) for a program of unknown need."""
        with self._cond:
            return self._take(max(0, self.budget_bytes - self.reserved) // 2)

    def reserve(self, amount: int) -> Reservation:
        """Reserve ``amount`` (at most the budget), waiting until it is free."""
        amount = min(amount, self.budget_bytes)
        with self._cond:
            if self.reserved + amount > self.budget_bytes:
                self.waits += 1
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: self.reserved + amount <= self.budget_bytes)
                finally:
                    self._waiting -= 1
            return self._take(amount)

    def release(self, reservation: Reservation) -> None:
        """Give a reservation back (once)."""
        with self._cond:
            self.reserved -= reservation.amount
            reservation.amount = 0
            self._cond.notify_all()


NEEDS_REMEMBERED = 4096


class Admission:
    """Host memory admission of a sandbox's tasks (``memory`` None: no ledger)."""

    def __init__(self, memory: HostMemory | None) -> None:
        """Admit against ``memory``; remember each warm program's need."""
        self.memory = memory
        self._needs: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    def _known(self, key: bytes | None) -> int | None:
        if key is None:
            return None
        with self._lock:
            return self._needs.get(key)

    def start(self, key: bytes | None) -> Reservation | None:
        """Reserve for a task: its known need (waiting for it) or an allowance."""
        if self.memory is None:
            return None
        need = self._known(key)
        return self.memory.allowance() if need is None else self.memory.reserve(need)

    async def start_async(self, key: bytes | None) -> Reservation | None:
        """:meth:`start` for an event loop (a wait for memory happens in a thread)."""
        if self.memory is None:
            return None
        need = self._known(key)
        if need is None:
            return self.memory.allowance()
        return await asyncio.to_thread(self.memory.reserve, need)

    def retry_need(self, reply: object, held: Reservation | None) -> int | None:
        """The need to wait for and try again with, when a task failed its memory check
        only because its allowance was short (None: the reply stands)."""
        if self.memory is None or held is None or not isinstance(reply, tuple):
            return None
        header = reply[0]
        diagnosis = header.get("diagnosis") if header.get("type") == "failed" else None
        if not isinstance(diagnosis, dict) or diagnosis.get("category") != "oom":
            return None
        required = diagnosis.get("required_bytes")
        available = diagnosis.get("available_bytes")
        if not isinstance(required, int) or available != held.amount:
            return None  # refused for another limit (outputs, the worker's own space)
        return required if self.memory.fits(required) else None

    def finish(self, key: bytes | None, reply: object, held: Reservation | None) -> None:
        """Release a task's reservation; remember its program's need from a success."""
        if self.memory is None or held is None:
            return
        self.memory.release(held)
        if key is None or not isinstance(reply, tuple):
            return
        need = reply[0].get("required_bytes")
        if isinstance(need, int) and need >= 0:
            with self._lock:
                self._needs[key] = need
                self._needs.move_to_end(key)
                while len(self._needs) > NEEDS_REMEMBERED:
                    self._needs.popitem(last=False)


__all__ = ["Admission", "HostMemory", "Reservation", "host_total_bytes"]
