"""Check the torch_xla route: export, run by a daemon, compare with torch eager, diagnose.

Three modules (an MLP, a conv net, a transformer block; ``tests/client/models/torch_zoo.py``)
and Silero VAD with the trained weights of the ``silero-vad`` wheel are exported by torch_xla
(in ``.venv-xla``) and by torchax; each program runs as an inference task on a real provider
daemon (anvil, escrow, sandboxed JAX worker) and compiles for TPU v5e through its compile
task; four modules that cannot be exported (no lowering, dynamic shape, data-dependent branch,
custom op) must come back diagnosed. Prints one line per program and one JSON object last:
``models_exported`` (by both routes, run and compiled), ``max_abs_err`` (worst over models and
routes), ``failures_diagnosed`` (torch_xla failures whose category is the expected one).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from client.models import ExportedModel  # noqa: E402
from client.models.export_diagnosis import ExportFailed  # noqa: E402
from contracts.messages import KIND_COMPILE  # noqa: E402
from tests.client.models.torch_support import (  # noqa: E402
    FAILURES,
    ROUTES,
    export_torchax,
    export_xla,
    make_cases,
    max_error,
    run_task,
    start_node,
)


def main() -> int:
    """Run the check; exit 1 when a figure misses its bar."""
    started = time.perf_counter()
    cases = make_cases()
    xla = export_xla(cases)
    xla_s = time.perf_counter() - started
    errors: dict[str, float] = {}
    exported = 0
    with tempfile.TemporaryDirectory() as tmp, start_node(Path(tmp)) as node:
        for name, case in cases.items():
            ok = True
            for route in ROUTES:
                model = xla[name] if route == "torch_xla" else export_torchax(case)
                if not isinstance(model, ExportedModel):
                    print(f"{name} {route}: {model}", flush=True)
                    ok = False
                    continue
                body = run_task(node, model.envelope(*case.inputs))
                compiled = run_task(node, model.compile_envelope(), KIND_COMPILE, "v5e:1x1")
                if body["state"] != "succeeded" or compiled["state"] != "succeeded":
                    print(f"{name} {route}: {body.get('diagnosis')} {compiled.get('diagnosis')}")
                    ok = False
                    continue
                outputs = model.decode_outputs(base64.b64decode(body["outputs_b64"]))
                errors[f"{name}/{route}"] = max_error(outputs, case)
                report = compiled["report"]
                print(
                    f"{name} {route}: max abs err {errors[f'{name}/{route}']:.2e}, "
                    f"v5e compile {report['device_kind']} "
                    f"{report['memory_total_bytes']:,} B, program {len(model.program):,} B",
                    flush=True,
                )
            exported += ok
    diagnosed = 0
    for name, (_, category, _) in FAILURES.items():
        failure = xla[name]
        if isinstance(failure, ExportFailed) and failure.diagnosis.category is category:
            diagnosed += 1
            d = failure.diagnosis
            print(f"{name} torch_xla: {d.category.value} ({d.op}): {d.message[:120]}")
    summary = {
        "models_exported": exported,
        "max_abs_err": max(errors.values()) if errors else None,
        "failures_diagnosed": diagnosed,
        "errors": errors,
        "torch_xla_worker_s": round(xla_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, sort_keys=True), flush=True)
    good = exported >= 3 and errors and max(errors.values()) <= 1e-4 and diagnosed >= 3
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
