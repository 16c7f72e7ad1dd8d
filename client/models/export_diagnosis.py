"""Why a PyTorch export failed: a category, the first real error line, the op, and hints.

Pure rules over the text of what ``torch.export``, torch_xla or torchax raised (no torch or
JAX import), in the spirit of the provider's compile diagnosis: a client sees *what* broke
and *what to change* instead of a 200-line traceback. The categories are the failures users
meet when they move a PyTorch model to a TPU program: an ATen op that has no lowering, a
shape that depends on the data, Python control flow on a tensor's value, and a custom op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from client.errors import ModelConversionError

MAX_MESSAGE_CHARS: Final = 500


class ExportCategory(StrEnum):
    """What kind of export failure this is."""

    UNSUPPORTED_OP = "unsupported_op"
    DYNAMIC_SHAPE = "dynamic_shape"
    DATA_DEPENDENT_CONTROL_FLOW = "data_dependent_control_flow"
    CUSTOM_OP = "custom_op"
    MODEL_LOAD = "model_load"
    WORKER_CRASH = "worker_crash"
    OTHER = "other"


HINTS: Final[dict[ExportCategory, tuple[str, ...]]] = {
    ExportCategory.UNSUPPORTED_OP: (
        "Rewrite the op with ops both routes lower (matmul, elementwise, reductions, conv, "
        "gather); linear algebra without an XLA kernel (eig, general solvers) stays on the host.",
        "Try the other route: torchax and torch_xla lower different sets of ATen ops.",
    ),
    ExportCategory.DYNAMIC_SHAPE: (
        "Give every tensor a size known from the input shapes: replace boolean masking, "
        "nonzero() and unique() by torch.where over the full tensor and a mask.",
        "Pad variable-length data to a fixed size; for a variable batch use the torchax "
        "route with batch_dim (a symbolic batch) or export one program per size.",
    ),
    ExportCategory.DATA_DEPENDENT_CONTROL_FLOW: (
        "Compute both branches and pick per element with torch.where(condition, a, b) "
        "instead of a Python `if` on a tensor's value; a loop on a value becomes a fixed "
        "number of steps, each masked with torch.where.",
        "torch.cond and torch.while_loop do not export to a task program by either route.",
        "Branch on shapes or on module attributes instead: those are known at export time.",
    ),
    ExportCategory.CUSTOM_OP: (
        "Custom ops (torch.library) have no StableHLO lowering: write the op with ATen ops "
        "inside forward, or register a CompositeImplicitAutograd kernel so it decomposes.",
    ),
    ExportCategory.MODEL_LOAD: (
        "The model must be given as 'path/to/file.py:factory', factory() returning an "
        "nn.Module; a state dict must name every parameter and buffer.",
        "Example inputs are one tensor per positional argument of forward.",
    ),
    ExportCategory.WORKER_CRASH: (
        "The export environment failed: rebuild it with `make .venv-xla/.installed`, "
        "then export again.",
    ),
    ExportCategory.OTHER: (
        "Run the model in eager PyTorch on the example inputs: if it fails there, fix that "
        "first error; if it runs, the failure is this route's: try the other route "
        "(`--from torch-xla` or `--from torchax`).",
    ),
}
OTHER_ROUTE: Final = {"torchax": "torch-xla", "torch_xla": "torchax", "torch-xla": "torchax"}
"""The route to try when one fails on a model that runs in eager."""


def with_other_route(diagnosis: ExportDiagnosis, *, exported: bool = False) -> ExportDiagnosis:
    """Return ``diagnosis`` for a model known to run in eager (or, ``exported``, known to export
    by the other route): its hints lead with the other route."""
    other = OTHER_ROUTE.get(diagnosis.route)
    if other is None:
        return diagnosis
    why = (
        f"The model exports by {other}"
        if exported
        else "The model runs in eager PyTorch on these inputs, so the failure is the "
        f"{diagnosis.route} route's"
    )
    hint = f"{why}: export it by the other route, `tpumarket job export --from {other} ...`."
    kept = tuple(h for h in diagnosis.hints if "try the other route" not in h.lower())
    return replace(diagnosis, hints=(hint, *kept))


@dataclass(frozen=True, slots=True)
class ExportDiagnosis:
    """A classified export failure."""

    category: ExportCategory
    message: str
    route: str
    stage: str | None = None
    op: str | None = None
    hints: tuple[str, ...] = ()

    def describe(self) -> str:
        """Return one paragraph for people: category, op, first error line, hints."""
        op = f" ({self.op})" if self.op else ""
        hints = " ".join(f"Hint: {h}" for h in self.hints)
        return f"{self.route} export failed: {self.category.value}{op}: {self.message}. {hints}"


class ExportFailed(ModelConversionError):
    """A model could not be exported; :attr:`diagnosis` says why and what to change."""

    def __init__(self, diagnosis: ExportDiagnosis, detail: str = "", subject: str = "") -> None:
        self.diagnosis = diagnosis
        self.detail = detail
        super().__init__(f"{subject}: {diagnosis.describe()}" if subject else diagnosis.describe())


_BUILTIN: Final = r"(?!aten\b|prims\b|xla\b|quantized\b|higher_order\b|_\w+\b)"
_HIGHER_ORDER: Final = r"(?:cond|while_loop|scan|associative_scan|map_impl|map)"
# Each rule: a category, what marks it in the text, and where the op's name is (group "op").
_RULES: Final[tuple[tuple[ExportCategory, re.Pattern[str], re.Pattern[str] | None], ...]] = (
    (  # torch.cond and its kin: control flow, whatever the route calls them
        ExportCategory.DATA_DEPENDENT_CONTROL_FLOW,
        re.compile(
            rf"higher_order(?:::|\.){_HIGHER_ORDER}\b|"
            rf"_higher_order_ops[/\\.]{_HIGHER_ORDER}\b"
        ),
        re.compile(
            rf"(?P<op>higher_order(?:::|\.){_HIGHER_ORDER})\b|"
            rf"_higher_order_ops[/\\.](?P<file>{_HIGHER_ORDER})\b"
        ),
    ),
    (
        ExportCategory.CUSTOM_OP,
        re.compile(
            rf"Could not run '{_BUILTIN}\w+::\w+'|target=torch\.ops\.{_BUILTIN}\w+\.\w+|"
            rf"capturable by Pytorch/XLA: {_BUILTIN}\w+::|no fake impl|register_fake"
        ),
        re.compile(
            rf"(?:Could not run '|torch\.ops\.|capturable by Pytorch/XLA: )"
            rf"(?P<op>{_BUILTIN}\w+(?:::|\.)\w+)"
        ),
    ),
    (
        ExportCategory.DYNAMIC_SHAPE,
        re.compile(
            r"capturable by Pytorch/XLA: aten::(?:nonzero|masked_select|unique|_unique2|"
            r"masked_scatter|repeat_interleave|item)\b|NonConcreteBooleanIndexError|"
            r"boolean indices must be concrete|Could not extract specialized integer from "
            r"data-dependent|data-dependent output size|dynamic shapes? (?:is|are) not supported|"
            r"specify a concrete value for the size argument|"
            r"jnp\.(?:unique|nonzero|argwhere|flatnonzero|unique_\w+)\(\)",
            re.IGNORECASE,
        ),
        re.compile(
            r"(?P<op>aten::\w+)|target=torch\.ops\.(?P<target>aten\.\w+)|"
            r"(?P<jnp>jnp\.\w+)\(\)"
        ),
    ),
    (
        ExportCategory.DATA_DEPENDENT_CONTROL_FLOW,
        re.compile(
            r"Could not guard on data-dependent expression|GuardOnDataDependentSymNode|"
            r"data-dependent (?:control flow|branching)|ConcretizationTypeError|"
            r"TracerBoolConversionError",
            re.IGNORECASE,
        ),
        None,
    ),
    (
        ExportCategory.UNSUPPORTED_OP,
        re.compile(
            r"not capturable by Pytorch/XLA|translation rule for primitive|no lowering|"
            r"OperatorNotFound|Could not run 'aten::|Unsupported (?:aten )?op|"
            r"No registered implementation|not implemented for 'XLA'",
            re.IGNORECASE,
        ),
        re.compile(
            r"(?P<op>aten::\w+)|primitive '(?P<prim>\w+)'|OperatorNotFound: (?P<nf>[\w.:]+)"
        ),
    ),
)
_NOISE = re.compile(
    r"^(Traceback \(most recent call last\)|File \"|\s*\^+\s*$|During handling|"
    r"The above exception|-+$|from user code:|\(Refer to the full stack trace|"
    r"Set TORCH_LOGS|For more information|For C\+\+ stack trace|WARNING:|"
    r"I\d{4} |W\d{4} )"
)
_EXC_PREFIX = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:\(\w+\))?:\s+")  # "torch.x.SomeError: "


def first_error_line(text: str) -> str:
    """Return the first line that says what went wrong, without traceback noise."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if "Traceback (most recent call last)" in text:
        raised = [line for line in lines if _EXC_PREFIX.match(line)]
        if raised:
            return (_EXC_PREFIX.sub("", raised[-1]) or raised[-1])[:MAX_MESSAGE_CHARS]
    for line in lines:
        if line and not _NOISE.match(line):
            return (_EXC_PREFIX.sub("", line) or line)[:MAX_MESSAGE_CHARS]
    return "unknown error"


def diagnose_export(
    text: str,
    *,
    route: str,
    stage: str | None = None,
    category: ExportCategory | None = None,
    context: str = "",
) -> ExportDiagnosis:
    """Classify the text of an export failure; ``category`` forces one (a load error).

    ``context`` (the traceback, say) is searched by the rules too, never quoted: torch.cond
    fails on torchax with an error that names only the frames it passed through.
    """
    op = None
    searched = f"{text}\n{context}" if context else text
    for rule_category, pattern, op_pattern in _RULES:
        if category is None and pattern.search(searched):
            category = rule_category
        if category is rule_category and op_pattern is not None:
            match = op_pattern.search(searched)
            if match is not None:
                op = next(g for g in match.groups() if g)
                if match.groupdict().get("file"):
                    op = f"torch.{op}"
            break
    category = category or ExportCategory.OTHER
    return ExportDiagnosis(
        category=category,
        message=first_error_line(text),
        route=route,
        stage=stage,
        op=op,
        hints=HINTS[category],
    )
