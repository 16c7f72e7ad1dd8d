"""Task execution inside a worker: validate, compile, run. Imports JAX; never run in the parent.

Every public method returns a reply header (and payload) for the parent; every failure is
caught here and sent back classified, so a bad blob costs one task, not the worker.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from programs.dtypes import check_result_dtypes
from programs.envelope import (
    ArrayFormat,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    encode_arrays,
    outputs_hash,
)
from programs.refusals import RejectedProgram
from programs.rules import installed_ranges
from provider.diagnosis import Category, Stage
from provider.sandbox.argcheck import argument_specs
from provider.sandbox.cache_wire import CacheSection, CacheWireError, unpack_request
from provider.sandbox.device_memory import DeviceMemory
from provider.sandbox.figures import cost_figures, memory_figures, total_bytes
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.replies import (
    CompiledReply,
    FailedReply,
    MissReply,
    RanReply,
    TaskError,
    ValidReply,
    failure,
)
from provider.sandbox.targets import (
    EXPORT_PLATFORM_ALIASES,
    Target,
    aot_devices,
    parse_target,
    platform_refusal,
)
from provider.sandbox.task_cache import TaskCache, attach_entries, install
from provider.sandbox.validation import ProgramValidator
from provider.sandbox.wire import Header

Progress = Callable[[Stage], None]


@dataclass
class _Compiled:
    executable: Any
    compile_time_s: float
    platform: str
    device_kind: str
    memory: dict[str, int] | None
    cost: dict[str, float] | None
    available_bytes: int | None
    devices: tuple[Any, ...]


@dataclass
class _Warm:
    """A program run before with these weights: its executable and device-resident weights."""

    compiled: _Compiled
    weights: dict[int, Any]
    inputs: dict[str, tuple[tuple[int, ...], str]]
    count: int


WarmKey = tuple[str, bytes, bytes | None]


class WorkerRuntime:
    """Holds a worker's JAX state: version ranges, compiled executables, cache settings."""

    def __init__(self, limits: SandboxLimits, cache_root: Path | None = None) -> None:
        """Import JAX, read this host's ranges and install the daemon-fed compile cache.

        ``cache_root`` is not read: the persistent cache is the daemon's, sent per task.
        """
        import importlib
        from importlib.metadata import version

        jax: Any = importlib.import_module("jax")
        from jax import monitoring

        self._jax = jax
        self.limits = limits
        self.cache_root = cache_root
        self.ranges = installed_ranges()
        self.jaxlib_version = version("jaxlib")
        self._compiled: OrderedDict[tuple[Any, ...], _Compiled] = OrderedDict()
        self._warm: OrderedDict[WarmKey, _Warm] = OrderedDict()
        self.memory = DeviceMemory(limits)
        self._cache_hits = 0
        self._parser_refusals = 0  # programs the StableHLO parser refused (validators)
        monitoring.register_event_listener(self._on_event)
        # A worker runs one task at a time and waits for its outputs: on the CPU backend,
        # asynchronous dispatch would only add a hop to XLA's thread and back per call
        # (measured: the worker's share of a small warm task ~15-20% shorter without it).
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        # Programs state their dtypes: without x64, JAX would narrow a float64 program's
        # arguments to float32 and then refuse its own call (and cast float64 inputs silently).
        jax.config.update("jax_enable_x64", True)
        self.local_device = jax.devices()[0]
        self.local_kind = str(self.local_device.device_kind)
        self.validator = ProgramValidator(jax, limits, self.ranges, self.local_device)
        self.cache = TaskCache()
        install(jax, self.cache)
        self._client = ""  # the tenant of the task in progress (from the daemon)
        self._allowance: int | None = None  # host memory the daemon reserved for this task

    def warm_up(self) -> None:
        """Exercise export, lowering and compile once so the first task pays no start-up."""
        jax = self._jax
        spec = jax.ShapeDtypeStruct((2,), np.float32)
        exported = jax.export.export(jax.jit(lambda x: x + 1))(spec)
        restored = jax.export.deserialize(exported.serialize())
        jax.jit(restored.call).lower(spec).compile()

    def _on_event(self, event: str, **_: str | int) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self._cache_hits += 1

    # ---- compile ----------------------------------------------------------------------

    def _specs(
        self, exported: Any, arguments: dict[str, np.ndarray[Any, Any]] | None
    ) -> list[tuple[tuple[int, ...], str]]:
        return argument_specs(exported.in_avals, arguments)

    def _devices_for(self, target: Target) -> tuple[Any, ...]:
        if not target.is_aot:
            return tuple(self._jax.devices())
        return aot_devices(target)

    def _compile(
        self,
        envelope: ProgramEnvelope,
        exported: Any,
        target: Target,
        specs: list[tuple[tuple[int, ...], str]],
        progress: Progress,
        *,
        executable_needed: bool,
    ) -> tuple[_Compiled, bool, float]:
        """Compile (or reuse); return the compiled program, whether a cache served it, and
        the seconds this call spent compiling."""
        jax = self._jax
        # Keyed by the tenant too: an executable one client's cache entries gave this worker
        # never serves another client.
        key = (self._client, envelope.program_sha256, target.name, tuple(specs), jax.__version__)
        cached = self._compiled.get(key)
        if cached is not None:
            self._compiled.move_to_end(key)
            return cached, True, 0.0
        devices = self._devices_for(target)
        device = devices[0]
        kind = str(device.device_kind)
        sharding = jax.sharding.SingleDeviceSharding(device)
        arg_specs = [
            jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in specs
        ]
        in_tree = exported.in_tree

        def flat_call(*flat: Any) -> Any:
            args, kwargs = jax.tree_util.tree_unflatten(in_tree, flat)
            return exported.call(*args, **kwargs)

        progress(Stage.COMPILE)
        hits_before = self._cache_hits
        started = time.perf_counter()
        active = self.cache.active
        self.cache.active = active and not target.is_aot  # AOT executables are not cached
        try:
            lowered = jax.jit(flat_call).lower(*arg_specs)
            executable = lowered.compile()
        finally:
            self.cache.active = active
        compile_time = time.perf_counter() - started
        cache_hit = self._cache_hits > hits_before
        memory = memory_figures(executable)
        cost = cost_figures(executable)
        available = self.memory.available_bytes(target, device)
        if self._allowance is not None and available is not None and not target.is_aot:
            available = min(available, self._allowance)  # the host's share the daemon gave
        compiled = _Compiled(
            executable=None if target.is_aot else executable,
            compile_time_s=compile_time,
            platform=str(device.platform),
            device_kind=kind,
            memory=memory,
            cost=cost,
            available_bytes=available,
            devices=devices,
        )
        self.memory.check_fits(
            memory, available, outputs_checked=executable_needed, kind=kind, target=target
        )
        if not target.is_aot:
            self._compiled[key] = compiled
            while len(self._compiled) > self.limits.compiled_cache_entries:
                self._compiled.popitem(last=False)
        return compiled, cache_hit, compile_time

    # ---- task entry points ------------------------------------------------------------

    def _enter(self, payload: bytes) -> bytes:
        """Take the daemon's cache section off ``payload``: the tenant, its entries."""
        section: CacheSection | None
        section, envelope = unpack_request(payload)
        self._client = "" if section is None else section.client
        self._allowance = None if section is None else section.memory_allowance
        if section is not None:
            self.cache.begin(section.entries)
        return envelope

    def _leave(self) -> dict[str, bytes]:
        self._client, self._allowance = "", None
        return self.cache.end()

    def compile(
        self, target_name: str, payload: bytes, progress: Progress
    ) -> tuple[CompiledReply | FailedReply, bytes]:
        """Validate and compile a program for a target; report its figures and new entries."""
        try:
            envelope = self._enter(payload)
            reply, body = self._compile_task(target_name, envelope, progress)
        except CacheWireError as exc:
            return failure(exc, Stage.PARSE, None, 0.0), b""
        finally:
            new = self._leave()
        return reply, attach_entries(reply, body, new)

    def run(self, payload: bytes, progress: Progress) -> tuple[RanReply | FailedReply, bytes]:
        """Validate, compile (or reuse) and execute; the reply lists the new cache entries."""
        try:
            envelope = self._enter(payload)
            reply, body = self._run_task(envelope, progress)
        except CacheWireError as exc:
            return failure(exc, Stage.PARSE, None, 0.0), b""
        finally:
            new = self._leave()
        return reply, attach_entries(reply, body, new)

    def _compile_task(
        self, target_name: str, payload: bytes, progress: Progress
    ) -> tuple[CompiledReply | FailedReply, bytes]:
        """Validate and compile a program for a target; report its figures."""
        stage = Stage.PARSE
        started = time.perf_counter()
        program_sha: bytes | None = None

        def track(new_stage: Stage) -> None:
            nonlocal stage
            stage = new_stage
            progress(new_stage)

        try:
            try:
                target = parse_target(target_name)
            except ValueError as exc:
                raise RejectedProgram(Category.PLATFORM_MISMATCH, str(exc)) from exc
            refusal = platform_refusal(target, str(self.local_device.platform))
            if refusal is not None:
                raise RejectedProgram(Category.PLATFORM_MISMATCH, refusal)
            envelope, exported = self.validator.load(payload)
            program_sha = envelope.program_sha256
            track(Stage.VALIDATE)
            self.validator.check_target(exported, target)
            self.validator.validate(exported, envelope.program_sha256)
            arguments = envelope.arguments() if envelope.inputs or envelope.weights else None
            specs = self._specs(exported, arguments)
            compiled, cache_hit, compile_time = self._compile(
                envelope, exported, target, specs, track, executable_needed=False
            )
        except Exception as exc:
            return failure(exc, stage, program_sha, time.perf_counter() - started), b""
        return {
            "type": "compiled",
            "program_sha256": envelope.program_sha256.hex(),
            "target": target.name,
            "platform": compiled.platform,
            "device_kind": compiled.device_kind,
            "compile_time_s": compile_time,
            "cache_hit": cache_hit,
            "memory": compiled.memory,
            "cost": compiled.cost,
            "available_bytes": compiled.available_bytes,
        }, b""

    def validate(
        self, payload: bytes, platform: str | None
    ) -> tuple[ValidReply | FailedReply, bytes]:
        """Parse and check a program without compiling it (a validator worker's one task).

        A validator runs apart from the executing workers, so a malformed program retires a
        validator, never a worker that holds other clients' warm programs. ``platform`` is
        where the program will run: a program exported for another is refused first, as the
        executing worker would.
        """
        stage = Stage.PARSE
        started = time.perf_counter()
        program_sha: bytes | None = None
        try:
            envelope, exported = self.validator.load(payload)
            program_sha = envelope.program_sha256
            stage = Stage.VALIDATE
            accepted = EXPORT_PLATFORM_ALIASES.get(platform or "", (platform,))
            if platform is not None and not any(p in accepted for p in exported.platforms):
                raise RejectedProgram(
                    Category.PLATFORM_MISMATCH,
                    f"Function '{exported.fun_name}' was exported for platforms "
                    f"'{tuple(exported.platforms)}' but it is used on '{accepted}'",
                )
            self.validator.validate(exported, envelope.program_sha256)
        except Exception as exc:
            reply = failure(exc, stage, program_sha, time.perf_counter() - started)
            if reply["recycle"]:  # the parser refused it: retire after a few such refusals
                self._parser_refusals += 1
                reply["recycle"] = self._parser_refusals >= self.limits.validator_refusals
            return reply, b""
        return {"type": "valid", "program_sha256": envelope.program_sha256.hex()}, b""

    def _run_task(self, payload: bytes, progress: Progress) -> tuple[RanReply | FailedReply, bytes]:
        """Validate, compile (or reuse) and execute a program on the local devices.

        A success keeps the executable and the weights on the device under (program hash,
        weights hash), so :meth:`run_warm` can serve the next task from its inputs alone.
        """
        jax = self._jax
        stage = Stage.PARSE
        started = time.perf_counter()
        program_sha: bytes | None = None
        compile_time = 0.0

        def track(new_stage: Stage, *, notify: bool = True) -> None:
            nonlocal stage
            stage = new_stage
            if notify:
                progress(new_stage)

        try:
            target = parse_target("local")
            envelope, exported = self.validator.load(payload)
            program_sha = envelope.program_sha256
            # A program validated before cannot hang or crash the parser: the parent's
            # parse-stage deadline covers the checks left, so spare it a message (hot path).
            track(Stage.VALIDATE, notify=not self.validator.is_validated(exported))
            self.validator.check_target(exported, target)
            check_result_dtypes(exported)
            self.validator.validate(exported, envelope.program_sha256)
            arguments = envelope.arguments()
            specs = self._specs(exported, arguments)
            compiled, cache_hit, compile_time = self._compile(
                envelope, exported, target, specs, track, executable_needed=True
            )
            track(Stage.EXECUTE)
            flat = jax.device_put(
                [arguments[str(i)] for i in range(len(specs))], compiled.devices[0]
            )
            jax.block_until_ready(flat)
            reply, outputs = self._execute(
                compiled,
                flat,
                envelope.program_sha256,
                envelope.inputs_sha256,
                cache_hit,
                compile_time,
            )
        except Exception as exc:
            return failure(
                exc, stage, program_sha, time.perf_counter() - started, compile_time=compile_time
            ), b""
        reply["warm"] = True
        weights = decode_arrays(envelope.weights, envelope.array_format) if envelope.weights else {}
        key = (
            self._client,
            envelope.program_sha256,
            None if envelope.weights is None else _sha256(envelope.weights),
        )
        self._warm[key] = _Warm(
            compiled=compiled,
            weights={int(name): flat[int(name)] for name in weights},
            inputs={
                name: (tuple(int(d) for d in value.shape), str(value.dtype))
                for name, value in arguments.items()
                if name not in weights
            },
            count=len(specs),
        )
        self._warm.move_to_end(key)
        while len(self._warm) > self.limits.compiled_cache_entries:
            self._warm.popitem(last=False)
        return reply, outputs

    def run_warm(
        self, header: Header, inputs: bytes
    ) -> tuple[RanReply | MissReply | FailedReply, bytes]:
        """Run a program that :meth:`run` served before with the same weights, from its inputs.

        The parent checked the envelope's hashes and sends only the inputs section. Anything
        this worker no longer holds, or inputs of other names, shapes or dtypes, answers
        ``miss``: the parent then sends the whole envelope through :meth:`run`, which
        validates, compiles and classifies as usual.
        """
        started = time.perf_counter()
        try:
            weights_hex = header.get("weights")
            key = (
                str(header.get("client", "")),
                bytes.fromhex(str(header["program"])),
                None if weights_hex is None else bytes.fromhex(str(weights_hex)),
            )
            warm = self._warm.get(key)
            if warm is None:
                return {"type": "miss"}, b""
            arrays = decode_arrays(inputs, ArrayFormat(header["array_format"]))
        except (KeyError, ValueError, ProgramFormatError):
            return {"type": "miss"}, b""
        shapes = {
            name: (tuple(int(d) for d in value.shape), str(value.dtype))
            for name, value in arrays.items()
        }
        if shapes != warm.inputs:
            return {"type": "miss"}, b""
        self._warm.move_to_end(key)
        try:
            # Host inputs go straight to the executable (its own transfer is far cheaper than
            # ``device_put`` for small arrays); the weights are already on the device.
            flat = [
                warm.weights[i] if i in warm.weights else arrays[str(i)] for i in range(warm.count)
            ]
            reply, outputs = self._execute(
                warm.compiled,
                flat,
                key[1],
                bytes.fromhex(str(header["inputs_sha256"])),
                True,
                0.0,
            )
        except Exception as exc:
            return failure(exc, Stage.EXECUTE, key[1], time.perf_counter() - started), b""
        return reply, outputs

    def _execute(
        self,
        compiled: _Compiled,
        flat: list[Any],
        program_sha: bytes,
        inputs_sha: bytes,
        cache_hit: bool,
        compile_time: float,
    ) -> tuple[RanReply, bytes]:
        jax = self._jax
        run_started = time.perf_counter()
        out = compiled.executable(*flat)
        jax.block_until_ready(out)
        device_time = time.perf_counter() - run_started
        leaves = jax.tree_util.tree_leaves(out)
        outputs = encode_arrays({str(i): np.asarray(leaf) for i, leaf in enumerate(leaves)})
        if len(outputs) > self.limits.max_output_bytes:
            raise TaskError(self.memory.outputs_too_large(len(outputs), Stage.EXECUTE))
        return {
            "type": "ran",
            "program_sha256": program_sha.hex(),
            "inputs_sha256": inputs_sha.hex(),
            "outputs_sha256": outputs_hash(outputs).hex(),
            "device_time_s": device_time,
            "cache_hit": cache_hit,
            "platform": compiled.platform,
            "device_kind": compiled.device_kind,
            "compile_time_s": compile_time,
            "required_bytes": None if compiled.memory is None else total_bytes(compiled.memory),
        }, outputs


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
