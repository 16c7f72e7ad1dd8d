"""The program rules as the sandbox's modules name them: they live in :mod:`programs.rules`.

The worker and the client's export check programs by the same rules (``programs`` imports
nothing of ours); this module only re-exports what the sandbox imports from here.
"""

from __future__ import annotations

from programs.refusals import RejectedProgram
from programs.rules import VersionRanges, parse_version

__all__ = ["RejectedProgram", "VersionRanges", "parse_version"]
