"""The sandbox's public face: submit an envelope, get a frozen result or a diagnosed failure."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from types import TracebackType
from typing import Any

from contracts.program import (
    ProgramEnvelope,
    ProgramFormatError,
    decode_envelope,
    encode_envelope,
)
from provider.capacity import Capacity, capacity_from_wire
from provider.diagnosis import HINT_SETS, Category, Diagnosis, Stage, diagnose
from provider.errors import SandboxError
from provider.sandbox.isolation import isolation_mode, worker_env
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.pool import StageObserver, WarmCall, WorkerPool
from provider.sandbox.results import (
    CompileResult,
    CostFigures,
    InferenceResult,
    MemoryFigures,
    TaskFailure,
)
from provider.sandbox.targets import parse_target, platform_refusal
from provider.sandbox.wire import Header
from provider.sandbox.worker_process import WorkerInfo

Envelope = ProgramEnvelope | bytes
VALIDATOR_NICE = 19
"""Validators parse strangers' new programs at this lower priority than the executing workers."""
VALIDATED_ENTRIES = 4096
"""How many validated (program, metadata) pairs the parent remembers."""


class Sandbox:
    """Validate, compile and run untrusted programs in a pool of spawned JAX workers.

    Never raises because of a blob: every failure comes back as a :class:`TaskFailure`.
    """

    def __init__(
        self,
        pool_size: int = 1,
        limits: SandboxLimits | None = None,
        cache_dir: Path | None = None,
        *,
        jax_platforms: str | None = None,
        on_stage: StageObserver | None = None,
        spares: int | None = None,
    ) -> None:
        """Start ``pool_size`` workers; ``jax_platforms`` sets their ``JAX_PLATFORMS``.

        ``spares`` ready workers more stand by to replace one retired after a crash or a
        timeout (default: enough for two ready workers in all). Apart from them, a validator
        (and a spare) parses and checks every program not seen before, on the CPU at a
        lower priority: a malformed program retires a validator, never a worker that holds
        other clients' warm programs, and its replacement starts off the task path.
        """
        self.limits = limits or SandboxLimits()
        env = {} if jax_platforms is None else {"JAX_PLATFORMS": jax_platforms}
        platforms = jax_platforms or os.environ.get("JAX_PLATFORMS", "")
        if platforms and "tpu" not in platforms.split(","):
            # libtpu only compiles ahead of time here and opens no chip, so several workers and
            # daemons on one host may load it; its single-process lockfile would refuse them.
            env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        self._pool = WorkerPool(
            pool_size,
            self.limits,
            cache_dir,
            worker_env(env),
            on_stage,
            spares=max(0, 2 - pool_size) if spares is None else spares,
        )
        try:
            self._validators = WorkerPool(
                1,
                dataclasses.replace(self.limits, nice=VALIDATOR_NICE, warm_up=False),
                None,
                worker_env({"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}),
                spares=1,
            )
        except BaseException:
            self._pool.close()
            raise
        self._validated: OrderedDict[bytes, None] = OrderedDict()
        self._validated_lock = threading.Lock()

    def __enter__(self) -> Sandbox:
        """Return the sandbox itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the workers."""
        self.close()

    def close(self) -> None:
        """Stop every worker and validator."""
        self._pool.close()
        self._validators.close()

    @property
    def replacements(self) -> int:
        """How many workers and validators were replaced after a crash, timeout or recycle."""
        return self._pool.replacements + self._validators.replacements

    @property
    def start_waits(self) -> int:
        """How many tasks found no ready worker (or validator) while replacements started."""
        return self._pool.start_waits + self._validators.start_waits

    def validators(self) -> list[WorkerInfo]:
        """Return the pid, start time and devices of each live validator."""
        return self._validators.worker_infos()

    @property
    def isolation(self) -> str:
        """Which isolation walls the workers in: ``bwrap``, ``unshare`` or ``rlimits``."""
        return isolation_mode().value

    def workers(self) -> list[WorkerInfo]:
        """Return the pid, start time and devices of each live worker."""
        return self._pool.worker_infos()

    def _payload(self, envelope: Envelope) -> bytes | TaskFailure:
        if isinstance(envelope, ProgramEnvelope):
            try:
                return encode_envelope(envelope)
            except ProgramFormatError as exc:
                return TaskFailure(
                    diagnosis=diagnose(Category.MALFORMED_INPUT, str(exc), stage=Stage.PARSE),
                    program_sha256=None,
                    elapsed_s=0.0,
                )
        data = bytes(envelope)
        if len(data) > self.limits.max_envelope_bytes:
            return TaskFailure(
                diagnosis=diagnose(
                    Category.MALFORMED_INPUT,
                    f"envelope of {len(data)} bytes exceeds the cap "
                    f"{self.limits.max_envelope_bytes}",
                    stage=Stage.PARSE,
                ),
                program_sha256=None,
                elapsed_s=0.0,
            )
        return data

    def _validation_key(
        self, payload: bytes, decoded: ProgramEnvelope | None
    ) -> bytes | TaskFailure:
        """Return what names a program as validated: its hash and its stated metadata."""
        if decoded is None:
            try:
                decoded = decode_envelope(payload, max_bytes=self.limits.max_envelope_bytes)
            except ProgramFormatError as exc:
                return TaskFailure(
                    diagnosis=diagnose(Category.MALFORMED_INPUT, str(exc), stage=Stage.PARSE),
                    program_sha256=None,
                    elapsed_s=0.0,
                )
        return decoded.program_sha256 + _metadata_digest(decoded)

    def _validate_request(self, request: Header) -> Header:
        """Ask a validator to check a program for where ``request`` will run it."""
        target = parse_target(str(request.get("target", "local")))
        if target.is_aot:
            return {"op": "validate", "platform": "tpu"}
        infos = self._pool.worker_infos()
        return {"op": "validate", "platform": infos[0].platform if infos else None}

    def _is_validated(self, key: bytes) -> bool:
        with self._validated_lock:
            if key in self._validated:
                self._validated.move_to_end(key)
                return True
            return False

    def _validated_now(
        self, key: bytes, reply: tuple[Header, bytes] | Diagnosis, started: float
    ) -> TaskFailure | None:
        """Record a validator's verdict; return the failure to answer, or None: go on."""
        answer = _reply(reply, started)
        if isinstance(answer, TaskFailure):
            return answer
        if answer[0].get("type") != "valid":
            return _bad_reply(ValueError(f"validator answered {answer[0].get('type')!r}"))
        with self._validated_lock:
            self._validated[key] = None
            while len(self._validated) > VALIDATED_ENTRIES:
                self._validated.popitem(last=False)
        return None

    def _call(
        self,
        request: Header,
        envelope: Envelope,
        warm: WarmCall | None = None,
        decoded: ProgramEnvelope | None = None,
    ) -> tuple[Header, bytes] | TaskFailure:
        started = time.perf_counter()
        payload = self._payload(envelope)
        if isinstance(payload, TaskFailure):
            return payload
        key = self._validation_key(payload, decoded)
        if isinstance(key, TaskFailure):
            return key
        if not self._is_validated(key):
            verdict = self._validators.call(self._validate_request(request), payload)
            failure = self._validated_now(key, verdict, started)
            if failure is not None:
                return failure
        return _reply(self._pool.call(request, payload, warm=warm), started)

    async def _call_async(
        self,
        request: Header,
        envelope: Envelope,
        warm: WarmCall | None = None,
        decoded: ProgramEnvelope | None = None,
    ) -> tuple[Header, bytes] | TaskFailure:
        started = time.perf_counter()
        payload = self._payload(envelope)
        if isinstance(payload, TaskFailure):
            return payload
        key = self._validation_key(payload, decoded)
        if isinstance(key, TaskFailure):
            return key
        if not self._is_validated(key):
            verdict = await self._validators.call_async(self._validate_request(request), payload)
            failure = self._validated_now(key, verdict, started)
            if failure is not None:
                return failure
        return _reply(await self._pool.call_async(request, payload, warm=warm), started)

    def target_refusal(self, target: str) -> str | None:
        """Say why this host cannot compile for ``target`` (None: it can).

        Checked in the parent in microseconds, before any worker or compiler sees the target:
        an unknown name, a topology larger than its generation's pod, or a platform name
        (``tpu``, ``gpu``) other than this host's devices.
        """
        try:
            parsed = parse_target(target)
        except ValueError as exc:
            return str(exc)
        platforms = {info.platform for info in self._pool.worker_infos()}
        for platform in platforms:
            refusal = platform_refusal(parsed, platform)
            if refusal is not None:
                return refusal
        return None

    def compile(self, envelope: Envelope, target: str = "local") -> CompileResult | TaskFailure:
        """Validate and compile a program for ``target`` (``local`` or e.g. ``v5e:1x1``)."""
        refusal = self.target_refusal(target)
        if refusal is not None:
            return TaskFailure(
                diagnosis=diagnose(Category.PLATFORM_MISMATCH, refusal, stage=Stage.PARSE),
                program_sha256=None,
                elapsed_s=0.0,
            )
        decoded = envelope if isinstance(envelope, ProgramEnvelope) else None
        reply = self._call({"op": "compile", "target": target}, envelope, decoded=decoded)
        if isinstance(reply, TaskFailure):
            return reply
        header, _ = reply
        try:
            memory = header["memory"]
            cost = header["cost"]
            return CompileResult(
                program_sha256=bytes.fromhex(header["program_sha256"]),
                target=str(header["target"]),
                platform=str(header["platform"]),
                device_kind=str(header["device_kind"]),
                compile_time_s=float(header["compile_time_s"]),
                cache_hit=bool(header["cache_hit"]),
                memory=None if memory is None else MemoryFigures(**memory),
                cost=None if cost is None else CostFigures(**cost),
                available_bytes=_opt_int(header["available_bytes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            return _bad_reply(exc)

    def run(
        self, envelope: Envelope, *, decoded: ProgramEnvelope | None = None
    ) -> InferenceResult | TaskFailure:
        """Validate, compile (or reuse) and execute a program on this host's devices.

        ``decoded`` is ``envelope`` already decoded and hash-checked by the caller (the
        daemon does it to check the signed request): a worker that ran the same program with
        the same weights is then sent only the inputs.
        """
        if isinstance(envelope, ProgramEnvelope):
            decoded = envelope
        warm = None if decoded is None else _warm(decoded)
        return _ran(self._call({"op": "run"}, envelope, warm, decoded))

    async def run_async(
        self, envelope: Envelope, *, decoded: ProgramEnvelope | None = None
    ) -> InferenceResult | TaskFailure:
        """:meth:`run` from an event loop, which reads and writes the worker's pipe itself."""
        if isinstance(envelope, ProgramEnvelope):
            decoded = envelope
        warm = None if decoded is None else _warm(decoded)
        return _ran(await self._call_async({"op": "run"}, envelope, warm, decoded))

    def capacity(
        self, *, benchmark: bool = True, aot_targets: tuple[str, ...] = ("v5e:1x1",)
    ) -> Capacity:
        """Discover devices and measure throughput inside a worker."""
        reply = self._pool.call(
            {"op": "capacity", "benchmark": benchmark, "aot_targets": list(aot_targets)}, b""
        )
        if isinstance(reply, Diagnosis):
            raise SandboxError(f"capacity discovery failed: {reply.message}")
        header, _ = reply
        if header.get("type") != "capacity":
            raise SandboxError(f"capacity discovery failed: {header}")
        return capacity_from_wire(header["capacity"])


def _reply(
    reply: tuple[Header, bytes] | Diagnosis, started: float
) -> tuple[Header, bytes] | TaskFailure:
    if isinstance(reply, Diagnosis):
        return TaskFailure(
            diagnosis=reply, program_sha256=None, elapsed_s=time.perf_counter() - started
        )
    header, body = reply
    if header.get("type") == "failed":
        return _failure_from_wire(header)
    return header, body


def _ran(reply: tuple[Header, bytes] | TaskFailure) -> InferenceResult | TaskFailure:
    if isinstance(reply, TaskFailure):
        return reply
    header, body = reply
    try:
        return InferenceResult(
            program_sha256=bytes.fromhex(header["program_sha256"]),
            inputs_sha256=bytes.fromhex(header["inputs_sha256"]),
            outputs=body,
            outputs_sha256=bytes.fromhex(header["outputs_sha256"]),
            device_time_s=float(header["device_time_s"]),
            compile_time_s=float(header["compile_time_s"]),
            cache_hit=bool(header["cache_hit"]),
            platform=str(header["platform"]),
            device_kind=str(header["device_kind"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return _bad_reply(exc)


def _warm(envelope: ProgramEnvelope) -> WarmCall:
    """The short request for a worker that ran this program with these weights and this
    metadata: an envelope stating other producer versions or platforms is checked in full
    (a version refused by a cold worker is refused by a warm one too)."""
    weights = envelope.weights_sha256  # set when the envelope was checked
    if weights is None and envelope.weights is not None:
        weights = hashlib.sha256(envelope.weights).digest()
    return WarmCall(
        key=envelope.program_sha256
        + _metadata_digest(envelope)
        + (b"" if weights is None else weights),
        request={
            "op": "run_warm",
            "program": envelope.program_sha256.hex(),
            "weights": None if weights is None else weights.hex(),
            "array_format": envelope.array_format.value,
            "inputs_sha256": envelope.inputs_sha256.hex(),
        },
        payload=envelope.inputs,
    )


def _metadata_digest(envelope: ProgramEnvelope) -> bytes:
    """Hash what an envelope states about its program besides its bytes."""
    producer = envelope.producer
    return _metadata_hash(
        producer.jax, producer.jaxlib, producer.calling_convention, tuple(envelope.platforms)
    )


@functools.lru_cache(maxsize=256)
def _metadata_hash(
    jax: str, jaxlib: str, calling_convention: int, platforms: tuple[str, ...]
) -> bytes:
    # Every task of a warm program states the same few values: hashed once, not twice a task.
    metadata = [jax, jaxlib, calling_convention, list(platforms)]
    return hashlib.sha256(json.dumps(metadata).encode()).digest()


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _failure_from_wire(header: Header) -> TaskFailure:
    try:
        wire = header["diagnosis"]
        category = Category(wire["category"])
        stage = None if wire["stage"] is None else Stage(wire["stage"])
        diagnosis = diagnose(
            category,
            str(wire["message"]),
            stage=stage,
            op=None if wire["op"] is None else str(wire["op"]),
            required_bytes=_opt_int(wire["required_bytes"]),
            available_bytes=_opt_int(wire["available_bytes"]),
            hints=HINT_SETS.get(str(wire.get("hints"))),
        )
        sha = header["program_sha256"]
        return TaskFailure(
            diagnosis=diagnosis,
            program_sha256=None if sha is None else bytes.fromhex(sha),
            elapsed_s=float(header["elapsed_s"]),
            compile_time_s=float(header.get("compile_time_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return _bad_reply(exc)


def _bad_reply(exc: Exception) -> TaskFailure:
    return TaskFailure(
        diagnosis=diagnose(Category.WORKER_CRASH, f"worker sent a malformed reply: {exc}"),
        program_sha256=None,
        elapsed_s=0.0,
    )
