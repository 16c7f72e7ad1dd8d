"""Program validation inside a worker: decode the envelope, check versions, target and ops.

The rules are :mod:`programs` (the client's export checks its programs by them too); this
class keeps the worker's cache of walked programs and turns a parser failure into a recycle.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from programs.dtypes import check_wide_dtypes
from programs.envelope import ProgramEnvelope, decode_envelope
from programs.opwalk import UnparsableModule, walk_module
from programs.refusals import Category, RejectedProgram
from programs.rules import VersionRanges
from programs.validation import UnreadableProgram, check_exported, check_stated, deserialize
from provider.diagnosis import Stage, diagnose
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.replies import TaskError
from provider.sandbox.targets import EXPORT_PLATFORM_ALIASES, Target


class ProgramValidator:
    """Loads and checks programs; keeps the deserialized programs whose ops it walked."""

    def __init__(
        self, jax: Any, limits: SandboxLimits, ranges: VersionRanges, local_device: Any
    ) -> None:
        """Check against this worker's ``ranges`` and ``local_device``."""
        self._jax = jax
        self.limits = limits
        self.ranges = ranges
        self.local_device = local_device
        self.local_kind = str(local_device.device_kind)
        self._programs: OrderedDict[bytes, Any] = OrderedDict()

    def load(self, payload: bytes) -> tuple[ProgramEnvelope, Any]:
        """Decode an envelope and deserialize its program, checking versions and metadata."""
        if len(payload) > self.limits.max_envelope_bytes:
            raise RejectedProgram(
                Category.MALFORMED_INPUT,
                f"envelope of {len(payload)} bytes exceeds the cap "
                f"{self.limits.max_envelope_bytes}",
            )
        envelope = decode_envelope(payload, max_bytes=self.limits.max_envelope_bytes)
        check_stated(envelope, self.ranges)
        known = self._programs.get(envelope.program_sha256)
        if known is not None:
            self._programs.move_to_end(envelope.program_sha256)
            if known.calling_convention_version != envelope.producer.calling_convention or tuple(
                known.platforms
            ) != tuple(envelope.platforms):
                raise RejectedProgram(
                    Category.MALFORMED_INPUT, "envelope metadata does not match the program"
                )
            return envelope, known
        try:
            exported = deserialize(self._jax, envelope.program)
        except UnreadableProgram as exc:
            raise TaskError(
                diagnose(exc.category, str(exc), stage=Stage.PARSE), recycle=True
            ) from exc
        check_exported(envelope, exported, self.ranges)
        return envelope, exported

    def check_target(self, exported: Any, target: Target) -> tuple[str, int]:
        """Refuse a program exported for another platform, dtype set or device count."""
        if target.is_aot:
            platform, count = "tpu", target.chips
        else:
            platform = str(self.local_device.platform)
            count = len(self._jax.devices())
        accepted = EXPORT_PLATFORM_ALIASES.get(platform, (platform,))
        if not any(p in accepted for p in exported.platforms):
            raise RejectedProgram(
                Category.PLATFORM_MISMATCH,
                f"Function '{exported.fun_name}' was exported for platforms "
                f"'{tuple(exported.platforms)}' but it is used on '{accepted}'",
            )
        where = f"target {target.name}" if target.is_aot else f"{self.local_kind}"
        check_wide_dtypes(exported, platform, where)
        if exported.nr_devices != 1 and exported.nr_devices != count:
            raise RejectedProgram(
                Category.DEVICE_COUNT_MISMATCH,
                f"Function '{exported.fun_name}' was exported for {exported.nr_devices} "
                f"devices but the target {target.name} has {count}",
            )
        return platform, count

    def is_validated(self, exported: Any) -> bool:
        """Whether ``exported`` is a program whose ops this validator walked before."""
        return any(e is exported for e in self._programs.values())

    def validate(self, exported: Any, program_sha: bytes) -> None:
        """Walk the program's ops (once per program); a parser failure asks for a recycle."""
        if self.is_validated(exported):
            return
        try:
            walk_module(exported, self.limits.max_ops, self.limits.max_nesting)
        except UnparsableModule as exc:
            diagnosis = diagnose(exc.category, str(exc), stage=Stage.VALIDATE)
            raise TaskError(diagnosis, recycle=True) from exc
        self._programs[program_sha] = exported
        while len(self._programs) > self.limits.compiled_cache_entries:
            self._programs.popitem(last=False)
