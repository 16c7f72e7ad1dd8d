"""The sandbox's public face: submit an envelope, get a frozen result or a diagnosed failure."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from programs.envelope import (
    ProgramEnvelope,
    ProgramFormatError,
    decode_envelope,
    encode_envelope,
)
from provider.capacity import Capacity, capacity_from_wire, tpu_compiler_available
from provider.diagnosis import Category, Diagnosis, Stage, diagnose
from provider.errors import SandboxError
from provider.sandbox.answers import bad_reply, compiled_of, ran_of, reply_of
from provider.sandbox.compile_store import client_id
from provider.sandbox.compiler import AOT_ENV, CompilerPool
from provider.sandbox.envelope_checks import envelope_refusal, ranges_from_wire
from provider.sandbox.fair import FairGate
from provider.sandbox.host_memory import Admission, HostMemory
from provider.sandbox.isolation import isolation_mode, worker_env
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.pool import StageObserver, WarmCall, WorkerPool
from provider.sandbox.results import CompileResult, InferenceResult, TaskFailure
from provider.sandbox.targets import parse_target, platform_refusal
from provider.sandbox.tenancy import Tenancy
from provider.sandbox.warm_requests import metadata_digest, warm_call
from provider.sandbox.wire import Header
from provider.sandbox.worker_process import WORKER_MODULE, WorkerInfo

Envelope = ProgramEnvelope | bytes
VALIDATOR_NICE = 19
"""Validators parse strangers' new programs at this lower priority than the executing workers."""
VALIDATED_ENTRIES = 4096
"""How many validated (program, metadata) pairs the parent remembers."""


class Sandbox:
    """Validate, compile and run untrusted programs in a pool of spawned JAX workers.

    Never raises because of a blob: every failure comes back as a :class:`TaskFailure`.
    Every task names its client (``client``, the deal's client address; None for direct
    users): its compile cache entries and reports are that client's alone
    (:class:`provider.sandbox.tenancy.Tenancy`), and its turn on the workers and validators
    comes from per-client queues served round-robin, at most ``client_share`` of the
    workers (at least one) and one validator per client in flight
    (:class:`provider.sandbox.fair.FairGate`).
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
        client_share: float = 0.5,
        validators: int = 2,
        validator_spares: int = 1,
        worker_module: str = WORKER_MODULE,
        host_memory: HostMemory | None = None,
    ) -> None:
        """Start ``pool_size`` workers; ``jax_platforms`` sets their ``JAX_PLATFORMS``.

        ``spares`` ready workers more stand by to replace one retired after a crash or a
        timeout (default: enough for two ready workers in all). Apart from them,
        ``validators`` (and ``validator_spares`` more) parse and check every program not seen
        before, on the CPU at a lower priority: a malformed program retires a validator, never
        a worker that holds other clients' warm programs, and its replacement starts off the
        task path. ``cache_dir`` holds the daemon's per-client compile store (no worker mounts it).
        ``host_memory`` is the ledger every task's memory is admitted against (default: 80%
        of this host's RAM; :mod:`provider.sandbox.host_memory`).
        """
        self.limits = limits or SandboxLimits()
        env = {} if jax_platforms is None else {"JAX_PLATFORMS": jax_platforms}
        platforms = jax_platforms or os.environ.get("JAX_PLATFORMS", "")
        if platforms and "tpu" not in platforms.split(","):
            # libtpu only compiles ahead of time here and opens no chip, so several workers and
            # daemons on one host may load it; its single-process lockfile would refuse them.
            env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        self.tenancy = Tenancy(cache_dir)
        self.gate = FairGate(pool_size, max(1, int(pool_size * client_share)))
        self.validator_gate = FairGate(validators, 1)
        self.admission = Admission(host_memory or HostMemory.of_host())
        self._pool = WorkerPool(
            pool_size,
            self.limits,
            None,  # the compile cache is the daemon's: sent per task, never mounted
            worker_env(env),
            on_stage,
            module=worker_module,
            spares=max(0, 2 - pool_size) if spares is None else spares,
        )
        try:
            self._validators = WorkerPool(
                validators,
                dataclasses.replace(self.limits, nice=VALIDATOR_NICE, warm_up=False),
                None,
                worker_env({"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}),
                spares=validator_spares,
            )
        except BaseException:
            self._pool.close()
            raise
        self._compiler = CompilerPool(
            dataclasses.replace(self.limits, warm_up=False), worker_env(AOT_ENV), worker_module
        )
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
        """Stop every worker, validator and the compiler worker."""
        self._pool.close()
        self._validators.close()
        self._compiler.close()

    @property
    def replacements(self) -> int:
        """How many workers and validators were replaced after a crash, timeout or recycle."""
        compiler = self._compiler.started
        extra = 0 if compiler is None else compiler.replacements
        return self._pool.replacements + self._validators.replacements + extra

    @property
    def stretched(self) -> int:
        """Stage limits moved to a task's budget: the host's load starved the worker."""
        return self._pool.stretched

    @property
    def start_waits(self) -> int:
        """How many tasks found no ready worker (or validator) while replacements started."""
        return self._pool.start_waits + self._validators.start_waits

    @property
    def cache_cross_reads(self) -> int:
        """Cache entries of one client found offered to another (never served; 0)."""
        return self.tenancy.cross_reads

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

    def compilers(self) -> list[WorkerInfo]:
        """Return the live compiler workers (none until an AOT compile needed one)."""
        compiler = self._compiler.started
        return [] if compiler is None else compiler.worker_infos()

    def _aot_apart(self) -> bool:
        """Whether TPU-target compiles go to the compiler worker: libtpu is installed and no
        worker drives a TPU (without libtpu there is nothing to keep out of the workers)."""
        infos = self._pool.worker_infos()
        return tpu_compiler_available() and all(info.platform != "tpu" for info in infos)

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

    def _decoded(
        self, payload: bytes, decoded: ProgramEnvelope | None
    ) -> ProgramEnvelope | TaskFailure:
        if decoded is not None:
            return decoded
        try:
            return decode_envelope(payload, max_bytes=self.limits.max_envelope_bytes)
        except ProgramFormatError as exc:
            return TaskFailure(
                diagnosis=diagnose(Category.MALFORMED_INPUT, str(exc), stage=Stage.PARSE),
                program_sha256=None,
                elapsed_s=0.0,
            )

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
        answer = reply_of(reply, started)
        if isinstance(answer, TaskFailure):
            return answer
        if answer[0].get("type") != "valid":
            return bad_reply(ValueError(f"validator answered {answer[0].get('type')!r}"))
        with self._validated_lock:
            self._validated[key] = None
            while len(self._validated) > VALIDATED_ENTRIES:
                self._validated.popitem(last=False)
        return None

    def _prepare(
        self, envelope: Envelope, decoded: ProgramEnvelope | None
    ) -> tuple[bytes, ProgramEnvelope, bytes] | TaskFailure:
        """The payload, the decoded envelope and the validation key of a task."""
        payload = self._payload(envelope)
        if isinstance(payload, TaskFailure):
            return payload
        checked = self._decoded(payload, decoded)
        if isinstance(checked, TaskFailure):
            return checked
        return payload, checked, checked.program_sha256 + metadata_digest(checked)

    def _call(
        self,
        request: Header,
        envelope: Envelope,
        warm: WarmCall | None = None,
        decoded: ProgramEnvelope | None = None,
        *,
        client: str | None = None,
        budget_s: float | None = None,
        compiler: bool = False,
    ) -> tuple[Header, bytes] | TaskFailure:
        started = time.perf_counter()
        prepared = self._prepare(envelope, decoded)
        if isinstance(prepared, TaskFailure):
            return prepared
        payload, checked, key = prepared
        tenant = client_id(client)
        pool, gate = self._pool, self.gate
        if compiler:
            pool, gate = self._compiler.pool(), self._compiler.gate
        if not self._is_validated(key):
            with self.validator_gate.held(tenant):
                verdict = self._validators.call(self._validate_request(request), payload)
            failure = self._validated_now(key, verdict, started)
            if failure is not None:
                return failure
        program, need = checked.program_sha256, None if warm is None else warm.key
        with gate.held(tenant):
            held, retried = self.admission.start(need), False
            while True:
                allowance = None if held is None else held.amount
                framed = self.tenancy.request(client, program, payload, allowance)
                reply = pool.call(request, framed, warm=warm, budget_s=budget_s)
                reply = self.tenancy.absorb(client, program, reply)
                more = None if retried else self.admission.retry_need(reply, held)
                self.admission.finish(need, reply, held)
                if more is None or self.admission.memory is None:
                    break
                retried = True
                held = self.admission.memory.reserve(more)  # wait until the host has it
        return reply_of(reply, started)

    async def _call_async(
        self,
        request: Header,
        envelope: Envelope,
        warm: WarmCall | None = None,
        decoded: ProgramEnvelope | None = None,
        *,
        client: str | None = None,
        budget_s: float | None = None,
    ) -> tuple[Header, bytes] | TaskFailure:
        started = time.perf_counter()
        prepared = self._prepare(envelope, decoded)
        if isinstance(prepared, TaskFailure):
            return prepared
        payload, checked, key = prepared
        tenant = client_id(client)
        if not self._is_validated(key):
            await self.validator_gate.enter_async(tenant)
            try:
                validate = self._validate_request(request)
                verdict = await self._validators.call_async(validate, payload)
            finally:
                self.validator_gate.leave(tenant)
            failure = self._validated_now(key, verdict, started)
            if failure is not None:
                return failure
        program, need = checked.program_sha256, None if warm is None else warm.key
        await self.gate.enter_async(tenant)
        try:
            held, retried = await self.admission.start_async(need), False
            while True:
                allowance = None if held is None else held.amount
                framed = self.tenancy.request(client, program, payload, allowance)
                reply = await self._pool.call_async(request, framed, warm=warm, budget_s=budget_s)
                reply = self.tenancy.absorb(client, program, reply)
                more = None if retried else self.admission.retry_need(reply, held)
                self.admission.finish(need, reply, held)
                if more is None or self.admission.memory is None:
                    break
                retried = True
                held = await asyncio.to_thread(self.admission.memory.reserve, more)
        finally:
            self.gate.leave(tenant)
        return reply_of(reply, started)

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

    def envelope_refusal(
        self, envelope: ProgramEnvelope, target: str | None
    ) -> tuple[str, str] | None:
        """Say (code, reason) why a worker would refuse ``envelope`` for what it states.

        Checked in the parent before the ack (nothing billed): the producer's JAX, calling
        convention and StableHLO versions against the workers' ranges, and the platforms
        against where the task would run (``target``: a compile task's; None: inference here).
        """
        infos = self._pool.worker_infos()
        ranges = next(filter(None, (ranges_from_wire(i.versions) for i in infos)), None)
        if target is not None and parse_target(target).is_aot:
            platform: str | None = "tpu"
        else:
            platform = infos[0].platform if infos else None
        return envelope_refusal(envelope, platform, ranges)

    def compile(
        self,
        envelope: Envelope,
        target: str = "local",
        *,
        client: str | None = None,
        budget_s: float | None = None,
    ) -> CompileResult | TaskFailure:
        """Validate and compile a program for ``target`` (``local`` or e.g. ``v5e:1x1``).

        An AOT target's report is served as a cache hit only from ``client``'s own reports.
        """
        refusal = self.target_refusal(target)
        if refusal is not None:
            return TaskFailure(
                diagnosis=diagnose(Category.PLATFORM_MISMATCH, refusal, stage=Stage.PARSE),
                program_sha256=None,
                elapsed_s=0.0,
            )
        decoded = envelope if isinstance(envelope, ProgramEnvelope) else None
        aot = parse_target(target).is_aot
        payload = self._payload(envelope)
        if aot and not isinstance(payload, TaskFailure):
            checked = self._decoded(payload, decoded)
            if isinstance(checked, TaskFailure):
                return checked
            decoded = checked
            hit = self.tenancy.cached_report(client, checked, parse_target(target).name)
            if hit is not None:
                return hit
        reply = self._call(
            {"op": "compile", "target": target},
            envelope,
            decoded=decoded,
            client=client,
            budget_s=budget_s,
            compiler=aot and self._aot_apart(),
        )
        result = compiled_of(reply)
        if aot and decoded is not None and isinstance(result, CompileResult):
            self.tenancy.keep_report(client, decoded, result)
        return result

    def run(
        self,
        envelope: Envelope,
        *,
        decoded: ProgramEnvelope | None = None,
        client: str | None = None,
        budget_s: float | None = None,
    ) -> InferenceResult | TaskFailure:
        """Validate, compile (or reuse) and execute a program on this host's devices.

        ``decoded`` is ``envelope`` already decoded and hash-checked by the caller (the
        daemon does it to check the signed request): a worker that ran the same program with
        the same weights for the same client is then sent only the inputs. ``budget_s``
        bounds the task's wall-clock time on a worker (its stages included): at the budget
        the worker is killed and replaced, and the task fails as a timeout.
        """
        if isinstance(envelope, ProgramEnvelope):
            decoded = envelope
        warm = None if decoded is None else warm_call(decoded, client)
        reply = self._call({"op": "run"}, envelope, warm, decoded, client=client, budget_s=budget_s)
        return ran_of(reply)

    async def run_async(
        self,
        envelope: Envelope,
        *,
        decoded: ProgramEnvelope | None = None,
        client: str | None = None,
        budget_s: float | None = None,
    ) -> InferenceResult | TaskFailure:
        """:meth:`run` from an event loop, which reads and writes the worker's pipe itself."""
        if isinstance(envelope, ProgramEnvelope):
            decoded = envelope
        warm = None if decoded is None else warm_call(decoded, client)
        reply = await self._call_async(
            {"op": "run"}, envelope, warm, decoded, client=client, budget_s=budget_s
        )
        return ran_of(reply)

    def capacity(
        self, *, benchmark: bool = True, aot_targets: tuple[str, ...] = ("v5e:1x1",)
    ) -> Capacity:
        """Discover devices and measure throughput inside a worker.

        The compile targets are probed where they will be compiled: in the compiler worker
        when no worker drives a TPU, so no executing worker loads libtpu.
        """
        if not aot_targets or not self._aot_apart():
            return _capacity(self._pool, benchmark, aot_targets)
        with ThreadPoolExecutor(1, thread_name_prefix="sandbox-probe") as probe:
            # The compiler worker starts while the executing one measures: no added wait.
            compiled = probe.submit(lambda: _capacity(self._compiler.pool(), False, aot_targets))
            here = _capacity(self._pool, benchmark, ())
            targets = compiled.result().compile_targets
        return dataclasses.replace(here, compile_targets=targets)


def _capacity(pool: WorkerPool, benchmark: bool, aot_targets: tuple[str, ...]) -> Capacity:
    reply = pool.call(
        {"op": "capacity", "benchmark": benchmark, "aot_targets": list(aot_targets)}, b""
    )
    if isinstance(reply, Diagnosis):
        raise SandboxError(f"capacity discovery failed: {reply.message}")
    header, _ = reply
    if header.get("type") != "capacity":
        raise SandboxError(f"capacity discovery failed: {header}")
    return capacity_from_wire(header["capacity"])
