"""`tpumarket job export --from torchax|torch-xla FILE.py:FACTORY`: a PyTorch model as a program.

``job export`` (``client.job_cli``) writes a model of the zoo; :func:`extend` teaches it the two
PyTorch routes. The model is named ``path/to/file.py:factory`` (``factory()`` returns an
``nn.Module``); ``--example-inputs`` gives one tensor per argument of ``forward``, as a spec
``float32[4,32]`` (seeded normal values; zeros for integers), an ``.npy`` file, or one
``.safetensors`` file holding all of them named ``0``, ``1``, ... ``--state-dict`` loads trained
weights from a safetensors file.

- ``--from torchax`` exports in this process (torch 2.13 + torchax, then ``jax.export``);
  ``--batch-dim NAME`` makes axis 0 of every input symbolic.
- ``--from torch-xla`` exports in the ``.venv-xla`` environment's Python (torch 2.9 +
  torch-xla 2.9, ``PJRT_DEVICE=CPU``; see ``client.models.from_torch_xla``), static shapes.

Both write the program envelope (program, weights, example inputs) that ``job run --program``
sends, and the example inputs as safetensors. A model that cannot be exported prints its
diagnosis (category, op, first error line, hints) and exits 1.

Every route (the zoo's too) checks the program it would write by the rules a provider
checks it by (:func:`programs.validation.check_program`, with this JAX's version ranges and a
daemon's op and nesting caps): a program that no provider runs on any of its platforms is not
written, and the command exits 2 with the provider's category, op, reason and hints. A
refusal on some platforms only (float64 on a TPU) is a note beside what was written.
``--provider-url URL`` checks by the rules that provider states in ``/v1/info`` instead.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client.cli import UsageError, emit_json, guarded, print_table
from client.errors import ProviderUnavailable
from client.models.program import ExportedModel
from client.models.signature import Array
from client.provider_http import ProviderHttp
from programs.envelope import (
    KNOWN_PLATFORMS,
    ArrayFormat,
    decode_arrays,
    encode_arrays,
    encode_envelope,
)
from programs.refusals import RejectedProgram
from programs.rules import (
    DEFAULT_MAX_NESTING,
    DEFAULT_MAX_OPS,
    VersionRanges,
    installed_ranges,
    ranges_from_wire,
)
from programs.validation import check_program

ROUTES = ("torchax", "torch-xla")
_SPEC = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9, ]*)\]$")


def extend(export: argparse.ArgumentParser) -> None:
    """Add the PyTorch routes to the ``job export`` parser (its zoo models stay as they are)."""
    zoo: tuple[str, ...] = ()
    for action in export._actions:  # the zoo's positional: free it to take a FILE.py:FACTORY
        if action.dest == "model":
            zoo = tuple(action.choices or ())
            action.choices = None
            action.metavar = "MODEL"
            action.help = f"a model of the zoo ({', '.join(zoo)}), or with --from FILE.py:FACTORY"
    export.add_argument(
        "--from", dest="route", choices=ROUTES, default=None, help="export a PyTorch module"
    )
    export.add_argument(
        "--example-inputs",
        nargs="+",
        default=[],
        metavar="INPUT",
        help="one per forward argument: dtype[dims] (float32[4,32]), FILE.npy, or FILE.safetensors",
    )
    export.add_argument("--state-dict", default=None, help="weights to load (safetensors)")
    export.add_argument(
        "--batch-dim", default=None, help="torchax: make axis 0 of every input symbolic"
    )
    export.add_argument(
        "--platforms", default="cpu,tpu", help="platforms the program runs on (cpu,tpu)"
    )
    export.add_argument(
        "--provider-url",
        default=None,
        help="check the program by this provider's rules (its /v1/info), not this version's",
    )
    zoo_handler: Callable[[argparse.Namespace], int] = export.get_default("handler")

    def handler(args: argparse.Namespace) -> int:
        if args.route is None:
            if args.model not in zoo:
                raise UsageError(
                    f"unknown model {args.model!r}: the zoo has {', '.join(zoo)}; "
                    f"export a PyTorch module with --from {'|'.join(ROUTES)} FILE.py:FACTORY"
                )
            return zoo_handler(args)
        return export_torch_model(args)

    export.set_defaults(handler=guarded(handler))


def example_inputs(items: list[str], seed: int = 0) -> list[Array]:
    """Parse ``--example-inputs``: specs, ``.npy`` files, or one ``.safetensors`` file."""
    if not items:
        raise UsageError("pass --example-inputs: one per argument of forward (float32[4,32])")
    if len(items) == 1 and items[0].endswith(".safetensors"):
        arrays = decode_arrays(Path(items[0]).read_bytes(), ArrayFormat.SAFETENSORS)
        if sorted(arrays) != sorted(str(i) for i in range(len(arrays))):
            raise UsageError(f"{items[0]} must name its tensors 0, 1, ...; it has {sorted(arrays)}")
        return [arrays[str(i)] for i in range(len(arrays))]
    rng = np.random.default_rng(seed)
    inputs = []
    for item in items:
        if item.endswith(".npy"):
            inputs.append(np.load(item, allow_pickle=False))
            continue
        match = _SPEC.match(item.strip())
        if match is None:
            raise UsageError(f"not an input spec, .npy or .safetensors file: {item!r}")
        try:
            dtype = np.dtype(match["dtype"])
        except TypeError:
            raise UsageError(f"unknown dtype in {item!r}") from None
        dims = tuple(int(d) for d in match["dims"].replace(" ", "").split(",") if d)
        if np.issubdtype(dtype, np.floating):
            inputs.append(rng.standard_normal(dims).astype(dtype))
        else:
            inputs.append(np.zeros(dims, dtype))
    return inputs


def export_torch_model(args: argparse.Namespace) -> int:
    """Export ``args.model`` by ``args.route``; write the program and inputs files."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from client.models.export_diagnosis import ExportFailed

    inputs = example_inputs(args.example_inputs)
    state = (
        decode_arrays(Path(args.state_dict).read_bytes(), ArrayFormat.SAFETENSORS)
        if args.state_dict
        else None
    )
    platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
    unknown = [p for p in platforms if p not in KNOWN_PLATFORMS]
    if not platforms or unknown:
        raise UsageError(
            f"--platforms takes some of {sorted(KNOWN_PLATFORMS)}, got {args.platforms!r}"
        )
    try:
        model = _export(args, inputs, state, platforms)
    except ExportFailed as exc:
        return _failed(args, _other_route_if_eager(args, inputs, state, exc))
    return write_program(args, model, args.route)


def _other_route_if_eager(
    args: argparse.Namespace, inputs: list[Array], state: dict[str, Array] | None, exc: Any
) -> Any:
    """Return a torch_xla failure (generic, or an op it cannot lower) with "export it by
    torchax" first when torchax, tried here, exports the model (the torchax route offers
    torch_xla itself, for a model that runs in eager)."""
    from client.models.export_diagnosis import ExportCategory, ExportFailed, with_other_route
    from client.models.from_torch import export_torch, load_module

    diagnosis = exc.diagnosis
    tried = (ExportCategory.OTHER, ExportCategory.UNSUPPORTED_OP)
    if args.route != "torch-xla" or diagnosis.category not in tried:
        return exc
    try:
        export_torch(load_module(args.model, state), inputs)
    except ExportFailed:
        return exc
    return ExportFailed(with_other_route(diagnosis, exported=True), exc.detail)


def write_program(args: argparse.Namespace, model: ExportedModel, route: str | None) -> int:
    """Write an exported model's program file (``--out``) and its example inputs
    (``--inputs-out``, else beside it), then say what was written (table or ``--json``)."""
    out = Path(args.out)
    envelope = model.example_envelope()
    rules = provider_rules(args.provider_url)
    try:
        checked = check_program(
            envelope, rules.ranges, max_ops=rules.max_ops, max_nesting=rules.max_nesting
        )
    except RejectedProgram as exc:
        return _refused(args, exc, rules.source)
    out.write_bytes(encode_envelope(envelope))
    inputs_out = (
        Path(args.inputs_out) if args.inputs_out else out.with_suffix(".inputs.safetensors")
    )
    inputs_out.write_bytes(encode_arrays(model.signature.bind_inputs(list(model.example_inputs))))
    summary: dict[str, Any] = {} if route is None else {"route": route}
    summary |= {
        "program": str(out),
        "inputs": str(inputs_out),
        "program_bytes": len(envelope.program),
        "weights_bytes": len(envelope.weights or b""),
        "platforms": list(model.platforms),
        "inputs_names": {s.key: s.describe() for s in model.signature.inputs},
        "outputs": [s.describe() for s in model.signature.outputs],
        "checked_by": rules.source,
        "op_count": checked.op_count,
        "refused_on": {p: _refusal_json(r) for p, r in checked.refused_on.items()},
    }
    if args.json:
        emit_json(summary)
        return 0
    how = "" if route is None else f"{route}: "
    print(
        f"wrote {out} ({how}program {len(envelope.program):,} B, "
        f"weights {len(envelope.weights or b''):,} B, platforms {','.join(model.platforms)})"
    )
    print(f"wrote {inputs_out} (example inputs)")
    print_table(["tensor", "input"], [[s.key, s.describe()] for s in model.signature.inputs])
    for platform, refused in checked.refused_on.items():
        print(f"note: {platform} providers refuse it: {_said(refused)}")
    return 0


@dataclass(frozen=True, slots=True)
class ProviderRules:
    """What a program is checked by: version ranges and caps, and whose they are."""

    ranges: VersionRanges
    max_ops: int
    max_nesting: int
    source: str


def provider_rules(url: str | None) -> ProviderRules:
    """Return the rules of the provider at ``url`` (its ``/v1/info``), or, without one, those a
    daemon of this version checks by (this JAX's ranges, the default caps)."""
    if url is None:
        return ProviderRules(installed_ranges(), DEFAULT_MAX_OPS, DEFAULT_MAX_NESTING, "defaults")
    provider = ProviderHttp(url, timeout_s=30.0, retries=1)
    try:
        stated = provider.info().get("programs")
    finally:
        provider.close()
    if not isinstance(stated, dict):
        raise UsageError(f"the provider at {url} states no program rules in /v1/info")
    ranges = ranges_from_wire(stated.get("ranges") or {})
    if ranges is None:
        raise ProviderUnavailable(
            f"the provider at {url} states no version ranges yet (its workers are starting): "
            "run the export again in a few seconds"
        )
    try:
        caps = int(stated["max_ops"]), int(stated["max_nesting"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"the provider at {url} states malformed op caps") from None
    return ProviderRules(ranges, caps[0], caps[1], url)


def _said(refusal: RejectedProgram) -> str:
    op = "" if refusal.op is None else f" (op {refusal.op})"
    return f"{refusal.category.value}{op}: {refusal}"


def _refusal_json(refusal: RejectedProgram) -> dict[str, Any]:
    return {
        "category": refusal.category.value,
        "op": refusal.op,
        "message": str(refusal),
        "hints": list(refusal.advice),
    }


def _refused(args: argparse.Namespace, refusal: RejectedProgram, source: str) -> int:
    """Say why no provider (or the one named) runs the program, in a provider's own words;
    write nothing."""
    if args.json:
        emit_json({"error": "refused_by_providers", "checked_by": source, **_refusal_json(refusal)})
        return 2
    who = "no provider runs" if source == "defaults" else f"the provider at {source} refuses"
    print(f"error: {who} this program: {_said(refusal)}", file=sys.stderr)
    for hint in refusal.advice:
        print(f"hint: {hint}", file=sys.stderr)
    print(f"nothing written to {args.out}", file=sys.stderr, flush=True)
    return 2


def _export(
    args: argparse.Namespace,
    inputs: list[Array],
    state: dict[str, Array] | None,
    platforms: tuple[str, ...],
) -> Any:
    if args.route == "torch-xla":
        if args.batch_dim is not None:
            raise UsageError("--batch-dim is for --from torchax: torch_xla exports static shapes")
        from client.models.from_torch_xla import export_torch_xla

        return export_torch_xla(args.model, inputs, state_dict=state, platforms=platforms)
    from client.models.from_torch import export_torch, load_module

    module = load_module(args.model, state)
    return export_torch(module, inputs, batch_dim=args.batch_dim, platforms=platforms)


def _failed(args: argparse.Namespace, exc: Any) -> int:
    diagnosis = exc.diagnosis
    if args.json:
        emit_json(
            {
                "route": args.route,
                "error": "export_failed",
                "category": diagnosis.category.value,
                "stage": diagnosis.stage,
                "op": diagnosis.op,
                "message": diagnosis.message,
                "hints": list(diagnosis.hints),
            }
        )
    else:
        print(f"error: {exc}", flush=True)
    return 1
