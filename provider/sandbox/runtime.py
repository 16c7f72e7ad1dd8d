"""Task execution inside a worker: validate, compile, run. Imports JAX; never run in the parent.

Every public method returns a reply header (and payload) for the parent; every failure is
caught here and sent back classified, so a bad blob costs one task, not the worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contracts.program import (
    ArrayFormat,
    ProgramEnvelope,
    ProgramFormatError,
    decode_arrays,
    decode_envelope,
    encode_arrays,
    outputs_hash,
)
from provider.diagnosis import Category, Diagnosis, Stage, classify, diagnose, hint_set_name
from provider.errors import ProviderError
from provider.sandbox.argcheck import argument_specs, check_result_dtypes, check_wide_dtypes
from provider.sandbox.checks import (
    RejectedProgram,
    VersionRanges,
    artifact_stablehlo_version,
    check_calling_convention,
    check_producer_jax,
    check_stablehlo,
    parse_version,
)
from provider.sandbox.figures import cost_figures, memory_figures, total_bytes
from provider.sandbox.limits import SandboxLimits
from provider.sandbox.opwalk import UnparsableModule, walk_module
from provider.sandbox.targets import (
    EXPORT_PLATFORM_ALIASES,
    HBM_BYTES_BY_KIND,
    Target,
    aot_devices,
    kind_slug,
    parse_target,
    platform_refusal,
)
from provider.sandbox.wire import Header

Progress = Callable[[Stage], None]


class TaskError(ProviderError):
    """A classified task failure raised inside the worker."""

    def __init__(self, diagnosis: Diagnosis, *, recycle: bool = False) -> None:
        """Carry ``diagnosis``; ``recycle`` asks the parent to replace this worker."""
        super().__init__(diagnosis.message)
        self.diagnosis = diagnosis
        self.recycle = recycle


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


WarmKey = tuple[bytes, bytes | None]


def _diagnosis_of(exc: BaseException, stage: Stage) -> Diagnosis:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RejectedProgram):
        return diagnose(exc.category, str(exc), stage=stage, op=exc.op, hints=exc.hints)
    if isinstance(exc, ProgramFormatError):
        return diagnose(Category.MALFORMED_INPUT, str(exc), stage=stage)
    return classify(text, stage)


def _rss_vm_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class WorkerRuntime:
    """Holds a worker's JAX state: version ranges, compiled executables, cache settings."""

    def __init__(self, limits: SandboxLimits, cache_root: Path | None) -> None:
        """Import JAX, read this host's ranges and turn on the per-kind persistent cache."""
        import importlib
        from importlib.metadata import version

        jax: Any = importlib.import_module("jax")
        from jax import export, monitoring
        from jax.extend.mlir.dialects import stablehlo

        self._jax = jax
        self.limits = limits
        self.cache_root = cache_root
        self.ranges = VersionRanges(
            jax=parse_version(jax.__version__),
            calling_convention_min=export.minimum_supported_calling_convention_version,
            calling_convention_max=export.maximum_supported_calling_convention_version,
            stablehlo_min=parse_version(stablehlo.get_minimum_version()),
            stablehlo_max=parse_version(stablehlo.get_current_version()),
        )
        self.jaxlib_version = version("jaxlib")
        self._compiled: OrderedDict[tuple[Any, ...], _Compiled] = OrderedDict()
        self._programs: OrderedDict[bytes, Any] = OrderedDict()
        self._warm: OrderedDict[WarmKey, _Warm] = OrderedDict()
        self._hbm_by_kind: dict[str, int] = {}
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
        if cache_root is not None:
            cache_dir = cache_root / kind_slug(self.local_kind) / "xla"
            cache_dir.mkdir(parents=True, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", str(cache_dir))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

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

    # ---- validation -------------------------------------------------------------------

    def _load(self, payload: bytes, progress: Progress) -> tuple[ProgramEnvelope, Any]:
        # The parent starts every task in the parse stage: no message needed for it.
        if len(payload) > self.limits.max_envelope_bytes:
            raise RejectedProgram(
                Category.MALFORMED_INPUT,
                f"envelope of {len(payload)} bytes exceeds the cap "
                f"{self.limits.max_envelope_bytes}",
            )
        envelope = decode_envelope(payload, max_bytes=self.limits.max_envelope_bytes)
        check_producer_jax(envelope.producer.jax, self.ranges)
        check_calling_convention(envelope.producer.calling_convention, self.ranges)
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
            exported = self._jax.export.deserialize(bytearray(envelope.program))
        except Exception as exc:
            raise TaskError(
                diagnose(
                    Category.MALFORMED_INPUT,
                    f"cannot deserialize the Exported flatbuffer: {type(exc).__name__}: {exc}",
                    stage=Stage.PARSE,
                ),
                recycle=True,
            ) from exc
        check_calling_convention(exported.calling_convention_version, self.ranges)
        if exported.calling_convention_version != envelope.producer.calling_convention:
            raise RejectedProgram(
                Category.MALFORMED_INPUT,
                "envelope states calling convention "
                f"{envelope.producer.calling_convention} but the program has "
                f"{exported.calling_convention_version}",
            )
        check_stablehlo(artifact_stablehlo_version(exported.mlir_module_serialized), self.ranges)
        if tuple(exported.platforms) != tuple(envelope.platforms):
            raise RejectedProgram(
                Category.MALFORMED_INPUT,
                f"envelope states platforms {envelope.platforms} but the program was "
                f"exported for {tuple(exported.platforms)}",
            )
        return envelope, exported

    def _check_target(self, exported: Any, target: Target) -> tuple[str, int]:
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

    def _is_validated(self, exported: Any) -> bool:
        return any(e is exported for e in self._programs.values())

    def _validate(self, exported: Any, program_sha: bytes) -> None:
        if self._is_validated(exported):
            return
        try:
            walk_module(exported, self.limits.max_ops)
        except UnparsableModule as exc:
            diagnosis = diagnose(exc.category, str(exc), stage=Stage.VALIDATE)
            raise TaskError(diagnosis, recycle=True) from exc
        except RejectedProgram:
            raise
        except Exception as exc:
            raise TaskError(
                diagnose(
                    Category.MALFORMED_INPUT,
                    f"cannot parse the StableHLO module: {type(exc).__name__}: {exc}",
                    stage=Stage.VALIDATE,
                ),
                recycle=True,
            ) from exc
        self._programs[program_sha] = exported
        while len(self._programs) > self.limits.compiled_cache_entries:
            self._programs.popitem(last=False)

    # ---- compile ----------------------------------------------------------------------

    def _specs(
        self, exported: Any, arguments: dict[str, np.ndarray[Any, Any]] | None
    ) -> list[tuple[tuple[int, ...], str]]:
        return argument_specs(exported.in_avals, arguments)

    def _available_bytes(self, target: Target, device: Any) -> int | None:
        if target.is_aot:
            return self._hbm_bytes(device)
        try:
            stats = device.memory_stats()
        except Exception:
            stats = None
        if stats and "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return max(0, self.limits.address_space_bytes - _rss_vm_bytes())

    def _hbm_bytes(self, device: Any) -> int | None:
        kind = str(device.device_kind)
        if kind not in self._hbm_by_kind:
            from provider.capacity import measure_hbm_bytes

            measured = measure_hbm_bytes(device) or HBM_BYTES_BY_KIND.get(kind)
            if measured is None:
                return None
            self._hbm_by_kind[kind] = measured
        return self._hbm_by_kind[kind]

    def _devices_for(self, target: Target) -> tuple[Any, ...]:
        if not target.is_aot:
            return tuple(self._jax.devices())
        return aot_devices(target)

    def _aot_report_path(self, key: tuple[Any, ...], kind: str) -> Path | None:
        if self.cache_root is None:
            return None
        digest = hashlib.sha256(json.dumps([repr(k) for k in key]).encode()).hexdigest()
        return self.cache_root / kind_slug(kind) / "aot-reports" / f"{digest}.json"

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
        key = (envelope.program_sha256, target.name, tuple(specs), jax.__version__)
        cached = self._compiled.get(key)
        if cached is not None:
            self._compiled.move_to_end(key)
            return cached, True, 0.0
        devices = self._devices_for(target)
        device = devices[0]
        kind = str(device.device_kind)
        report_path = None if executable_needed else self._aot_report_path(key, kind)
        if report_path is not None and report_path.exists() and target.is_aot:
            report = json.loads(report_path.read_text())
            return (
                _Compiled(
                    executable=None,
                    compile_time_s=0.0,
                    platform=str(device.platform),
                    device_kind=kind,
                    memory=report["memory"],
                    cost=report["cost"],
                    available_bytes=report["available_bytes"],
                    devices=devices,
                ),
                True,
                0.0,
            )
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
        if target.is_aot:
            jax.config.update("jax_enable_compilation_cache", False)
        try:
            lowered = jax.jit(flat_call).lower(*arg_specs)
            executable = lowered.compile()
        finally:
            if target.is_aot:
                jax.config.update("jax_enable_compilation_cache", True)
        compile_time = time.perf_counter() - started
        cache_hit = self._cache_hits > hits_before
        memory = memory_figures(executable)
        cost = cost_figures(executable)
        available = self._available_bytes(target, device)
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
        outputs_bytes = 0 if memory is None or not executable_needed else memory["output_bytes"]
        if outputs_bytes > self.limits.max_output_bytes:
            raise TaskError(self._outputs_too_large(outputs_bytes, Stage.COMPILE))
        if memory is not None and available is not None:
            required = total_bytes(memory)
            if required > available:
                raise TaskError(
                    diagnose(
                        Category.OOM,
                        f"program needs {required} bytes of device memory (arguments "
                        f"{memory['argument_bytes']}, outputs {memory['output_bytes']}, "
                        f"temporaries {memory['temp_bytes']}) but {kind} on {target.name} "
                        f"has {available} available",
                        stage=Stage.COMPILE,
                        required_bytes=required,
                        available_bytes=available,
                    )
                )
        if report_path is not None and target.is_aot:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = report_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(
                json.dumps({"memory": memory, "cost": cost, "available_bytes": available})
            )
            tmp.replace(report_path)
        if not target.is_aot:
            self._compiled[key] = compiled
            while len(self._compiled) > self.limits.compiled_cache_entries:
                self._compiled.popitem(last=False)
        return compiled, cache_hit, compile_time

    def _outputs_too_large(self, size: int, stage: Stage) -> Diagnosis:
        cap = self.limits.max_output_bytes
        return diagnose(
            Category.OOM,
            f"the program's outputs need {size} bytes, over this provider's cap of {cap} "
            "bytes of outputs per task",
            stage=stage,
            required_bytes=size,
            available_bytes=cap,
        )

    # ---- task entry points ------------------------------------------------------------

    def compile(self, target_name: str, payload: bytes, progress: Progress) -> tuple[Header, bytes]:
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
            envelope, exported = self._load(payload, track)
            program_sha = envelope.program_sha256
            track(Stage.VALIDATE)
            self._check_target(exported, target)
            self._validate(exported, envelope.program_sha256)
            arguments = envelope.arguments() if envelope.inputs or envelope.weights else None
            specs = self._specs(exported, arguments)
            compiled, cache_hit, compile_time = self._compile(
                envelope, exported, target, specs, track, executable_needed=False
            )
        except Exception as exc:
            return _failure(exc, stage, program_sha, time.perf_counter() - started), b""
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

    def validate(self, payload: bytes, platform: str | None) -> tuple[Header, bytes]:
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
            envelope, exported = self._load(payload, lambda _: None)
            program_sha = envelope.program_sha256
            stage = Stage.VALIDATE
            accepted = EXPORT_PLATFORM_ALIASES.get(platform or "", (platform,))
            if platform is not None and not any(p in accepted for p in exported.platforms):
                raise RejectedProgram(
                    Category.PLATFORM_MISMATCH,
                    f"Function '{exported.fun_name}' was exported for platforms "
                    f"'{tuple(exported.platforms)}' but it is used on '{accepted}'",
                )
            self._validate(exported, envelope.program_sha256)
        except Exception as exc:
            reply = _failure(exc, stage, program_sha, time.perf_counter() - started)
            if reply["recycle"]:  # the parser refused it: retire after a few such refusals
                self._parser_refusals += 1
                reply["recycle"] = self._parser_refusals >= self.limits.validator_refusals
            return reply, b""
        return {"type": "valid", "program_sha256": envelope.program_sha256.hex()}, b""

    def run(self, payload: bytes, progress: Progress) -> tuple[Header, bytes]:
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
            envelope, exported = self._load(payload, track)
            program_sha = envelope.program_sha256
            # A program validated before cannot hang or crash the parser: the parent's
            # parse-stage deadline covers the checks left, so spare it a message (hot path).
            track(Stage.VALIDATE, notify=not self._is_validated(exported))
            self._check_target(exported, target)
            check_result_dtypes(exported)
            self._validate(exported, envelope.program_sha256)
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
                compiled, flat, envelope.program_sha256, envelope.inputs_sha256, cache_hit
            )
        except Exception as exc:
            return _failure(
                exc, stage, program_sha, time.perf_counter() - started, compile_time=compile_time
            ), b""
        reply.update(compile_time_s=compile_time, warm=True)
        weights = decode_arrays(envelope.weights, envelope.array_format) if envelope.weights else {}
        key = (
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

    def run_warm(self, header: Header, inputs: bytes) -> tuple[Header, bytes]:
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
                warm.compiled, flat, key[0], bytes.fromhex(str(header["inputs_sha256"])), True
            )
        except Exception as exc:
            return _failure(exc, Stage.EXECUTE, key[0], time.perf_counter() - started), b""
        reply["compile_time_s"] = 0.0
        return reply, outputs

    def _execute(
        self,
        compiled: _Compiled,
        flat: list[Any],
        program_sha: bytes,
        inputs_sha: bytes,
        cache_hit: bool,
    ) -> tuple[Header, bytes]:
        jax = self._jax
        run_started = time.perf_counter()
        out = compiled.executable(*flat)
        jax.block_until_ready(out)
        device_time = time.perf_counter() - run_started
        leaves = jax.tree_util.tree_leaves(out)
        outputs = encode_arrays({str(i): np.asarray(leaf) for i, leaf in enumerate(leaves)})
        if len(outputs) > self.limits.max_output_bytes:
            raise TaskError(self._outputs_too_large(len(outputs), Stage.EXECUTE))
        return {
            "type": "ran",
            "program_sha256": program_sha.hex(),
            "inputs_sha256": inputs_sha.hex(),
            "outputs_sha256": outputs_hash(outputs).hex(),
            "device_time_s": device_time,
            "cache_hit": cache_hit,
            "platform": compiled.platform,
            "device_kind": compiled.device_kind,
        }, outputs


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _failure(
    exc: BaseException,
    stage: Stage,
    program_sha: bytes | None,
    elapsed: float,
    *,
    compile_time: float = 0.0,
) -> Header:
    if isinstance(exc, TaskError):
        diagnosis, recycle = exc.diagnosis, exc.recycle
    else:
        diagnosis, recycle = _diagnosis_of(exc, stage), False
    return {
        "type": "failed",
        "diagnosis": diagnosis_to_wire(diagnosis),
        "program_sha256": None if program_sha is None else program_sha.hex(),
        "elapsed_s": elapsed,
        "compile_time_s": compile_time,
        "recycle": recycle,
    }


def diagnosis_to_wire(diagnosis: Diagnosis) -> Header:
    """Encode a diagnosis as a JSON-able dict for the parent."""
    return {
        "category": diagnosis.category.value,
        "message": diagnosis.message,
        "stage": None if diagnosis.stage is None else diagnosis.stage.value,
        "op": diagnosis.op,
        "required_bytes": diagnosis.required_bytes,
        "available_bytes": diagnosis.available_bytes,
        "hints": hint_set_name(diagnosis.hints),
    }
