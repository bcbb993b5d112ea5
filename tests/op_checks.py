"""Test cases built from the manifest, and the check of an op against its reference.

``manifest_cases`` turns an op's manifest entry into concrete cases: its
workloads plus awkward shapes (sizes 1, 3, 127, 4097, ranks 1-4, every valid
``dim``, empty tensors, 0-d tensors, non-contiguous views).  ``check_against_reference``
runs the op on random inputs and compares with the manifest reference computed
in float64.  CPU tests and GPU tests share both.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from codegen import load_manifest, rules
from codegen.model import OpSpec
from validator.cases import static_dim_size

Shape = Tuple[int, ...]

# Relative tolerance per dtype, stated once; the absolute part scales with the output's magnitude.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-10}
ODD_SIZES = (1, 3, 127, 4097)
# How many times the reference's own float32 error a result may be off by, with ``float32_slack``:
# two float32 algorithms (ours, PyTorch's) differ by a few times either's error where a result is
# ill-conditioned (a constant row normalised: its gradient is rounding noise times 1 / sqrt(eps)).
SLACK_FACTOR = 8
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Case:
    op: str
    shapes: Tuple[Tuple[str, Shape], ...]
    dtype: torch.dtype
    params: Tuple[Tuple[str, Any], ...] = ()
    layout: str = "contiguous"  # or "strided": every input a non-contiguous view
    label: str = ""
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # (input, layout) for every input, replacing ``layout`` when given: one of ``INPUT_LAYOUTS``.
    input_layouts: Tuple[Tuple[str, str], ...] = ()
    # (input, dtype) of inputs whose dtype the manifest leaves free of ``dtype``'s (soft targets).
    input_dtypes: Tuple[Tuple[str, torch.dtype], ...] = ()

    def __str__(self) -> str:
        shapes = ",".join(f"{n}{list(s)}" for n, s in self.shapes)
        params = ",".join(f"{k}={v}" for k, v in self.params)
        dtype = str(self.dtype).replace("torch.", "")
        layout = ",".join(f"{n}:{l}" for n, l in self.input_layouts) or self.layout
        dtypes = ",".join(f"{n}:{str(d).replace('torch.', '')}" for n, d in self.input_dtypes)
        return "-".join(p for p in (self.label, shapes, dtype, dtypes, params, layout) if p)


@functools.lru_cache(maxsize=1)
def _manifest():
    # Loading validates every YAML file against the schema (tenths of a second); tests ask per case.
    return load_manifest()


def _spec(op_name: str) -> OpSpec:
    return _manifest().op(op_name)


def _values(op: OpSpec, shapes: Dict[str, Shape], params: Dict[str, Any]) -> Dict[str, Any]:
    """Params (with defaults) and the static dims they imply for these shapes."""
    values = {p.name: p.default for p in op.params if p.has_default}
    values.update(params)
    for dim in op.static_dims:
        values[dim.name] = static_dim_size(dim, shapes, values)
    return values


def accepted(op: OpSpec, shapes: Dict[str, Shape], params: Dict[str, Any]) -> bool:
    """Whether the manifest's preconditions accept these shapes and params."""
    try:
        values = _values(op, shapes, params)
        return all(rules.evaluate(rule.expr, shapes, values) for rule in op.shape_rules)
    except (IndexError, KeyError, ValueError):
        return False


def _derived_shapes(op: OpSpec, free_shape: Shape, params: Dict[str, Any]) -> Optional[Dict[str, Shape]]:
    """Give every input without a declared shape ``free_shape``; resolve declared shapes by name."""
    shapes = {t.name: free_shape for t in op.inputs if t.shape is None}
    try:
        values = _values(op, shapes, params)
    except (IndexError, KeyError):
        return None
    for t in op.inputs:
        if t.shape is not None:
            if not all(isinstance(d, int) or d in values for d in t.shape):
                return None
            shapes[t.name] = tuple(d if isinstance(d, int) else values[d] for d in t.shape)
    return shapes


def _int_param_values(op: OpSpec, rank: int) -> List[Dict[str, Any]]:
    """Every valid value of axis-like int params (named dim) for this rank, else the default.
    A 0-d tensor takes dims 0 and -1, as in PyTorch."""
    axes = range(-max(rank, 1), max(rank, 1))
    choices = []
    for p in op.params:
        if p.name != "dim":
            continue
        if p.type == "int":
            choices.append([(p.name, d) for d in axes])
        elif p.type == "Optional[int]":
            choices.append([(p.name, None)] + [(p.name, d) for d in axes])
        elif p.type == "Optional[Sequence[int]]":
            # Every single axis, all axes (None), and the first and last together.
            pairs = [(p.name, (0, rank - 1))] if rank > 1 else []
            choices.append([(p.name, None)] + [(p.name, (d,)) for d in axes] + pairs)
    return [dict(row) for row in itertools.product(*choices)] or [{}]


def _sized_axis(params: Dict[str, Any], rank: int) -> int:
    """The axis that gets the odd size: ``dim`` (its first axis for a tuple; the last for None)."""
    dim = params.get("dim", -1)
    if dim is None:
        dim = -1
    elif isinstance(dim, tuple):
        dim = dim[0]
    return dim % rank


def family_ops(family: str) -> Tuple[str, ...]:
    """The implemented ops of a manifest family, in manifest order: an op a kernel author adds to
    the family gets the family's GPU tests over its workloads and awkward shapes with no list to
    edit."""
    return tuple(op.name for op in _manifest().ops if op.family == family and op.status == "implemented")


def manifest_cases(op_name: str, dtypes: Optional[Sequence[str]] = None, max_numel: int = 1 << 30,
                   seed: int = 0) -> List[Case]:
    """Workloads plus awkward shapes for ``op_name``, each accepted by its shape rules."""
    op = _spec(op_name)
    rng = random.Random(seed)
    union = op.resolved_dtype_names(op.primary_input.name)
    names = [d for d in (dtypes or union) if d in DTYPES and d in union]
    cases: List[Case] = []
    for workload in op.workloads:
        if max(torch.Size(s).numel() for _, s in workload.shapes) > max_numel:
            continue
        for dtype in workload.dtypes:
            if dtype in names:
                params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in workload.params)
                cases.append(Case(op.name, workload.shapes, DTYPES[dtype], params, label=workload.label))
    for rank in (1, 2, 3, 4):
        for size in ODD_SIZES:
            for params in _int_param_values(op, rank):
                shape = [rng.choice((1, 2, 3, 5)) for _ in range(rank)]
                axis = _sized_axis(params, rank)
                shape[axis] = size
                shapes = _derived_shapes(op, tuple(shape), params)
                if shapes is None or not accepted(op, shapes, params):
                    continue
                if max(torch.Size(s).numel() for s in shapes.values()) > min(max_numel, 1 << 22):
                    continue
                dtype = DTYPES[names[(rank + size) % len(names)]]
                layout = "strided" if (rank + size) % 3 == 0 else "contiguous"
                cases.append(Case(op.name, tuple(shapes.items()), dtype, tuple(params.items()), layout, f"rank{rank}"))
    empty = _derived_shapes(op, (0, 7), {})
    if empty is not None and accepted(op, empty, {}):
        cases.append(Case(op.name, tuple(empty.items()), DTYPES[names[0]], (), "contiguous", "empty"))
    for params in _int_param_values(op, 0):
        scalar = _derived_shapes(op, (), params)
        if scalar is not None and accepted(op, scalar, params):
            cases.append(Case(op.name, tuple(scalar.items()), DTYPES[names[-1]], tuple(params.items()),
                              "contiguous", "scalar"))
    return cases


def single_row_cases(op_name: str, max_numel: int = 1 << 22) -> List[Case]:
    """The op's workloads cut to one row (every leading axis of the first 2-D input's size made 1)
    with every input sliced from a buffer three elements wider (``laid_out``'s ``padded``): a
    tensor PyTorch calls contiguous whatever its first stride, which is no row's distance."""
    op = _spec(op_name)
    cases = []
    for workload in op.workloads:
        shapes = dict(workload.shapes)
        rows = next((shape[0] for shape in shapes.values() if len(shape) >= 2), 1)
        if rows == 1:
            continue
        cut = {name: tuple(1 if axis == 0 and size == rows else size for axis, size in enumerate(shape))
               for name, shape in shapes.items()}
        params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in workload.params)
        if not accepted(op, cut, dict(params)) or max(math.prod(s) for s in cut.values()) > max_numel:
            continue
        layouts = tuple((t.name, "padded" if cut[t.name] else "contiguous") for t in op.inputs)
        cases.append(Case(op.name, tuple(cut.items()), DTYPES[workload.dtypes[0]], params, label="one-row",
                          input_layouts=layouts))
    return cases


def make_inputs(op: OpSpec, case: Case, device: str, generator: torch.Generator) -> List[Optional[torch.Tensor]]:
    """Random inputs (never zeros); ``strided`` cases get non-contiguous views of the same shapes,
    and a case with ``input_layouts`` gets each input in its own layout (``laid_out``)."""
    if case.input_layouts:
        return _inputs_in_layouts(op, case, device, generator)
    tensors = []
    shapes = dict(case.shapes)
    for t in op.inputs:
        shape = shapes[t.name]
        declared = _declared_dtype(t)
        if declared == torch.int64:
            tensors.append(_class_indices(op, case, shape, generator).to(device))
            continue
        if declared is not None:
            # An explicitly typed float input (e.g. saved float32 statistics) keeps its type.
            tensors.append(torch.randn(tuple(shape), generator=generator).to(device=device, dtype=declared))
            continue
        if case.layout == "strided" and len(shape) >= 1:
            # Every other element of a twice-as-wide buffer: same shape, not contiguous.  Sliced
            # after the move, which would otherwise hand back a contiguous copy.
            base = torch.randn(*shape[:-1], 2 * shape[-1], generator=generator, dtype=torch.float32)
            tensors.append(base.to(device=device, dtype=case.dtype)[..., ::2])
            continue
        value = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
        tensors.append(value.to(device=device, dtype=case.dtype))
    return tensors


def _declared_dtype(t) -> Optional[torch.dtype]:
    """The one dtype an input declares (class indices, saved float32 statistics), else None."""
    names = t.dtype.names if t.dtype.same_as is None else ()
    return getattr(torch, names[0]) if len(names) == 1 else None


# Memory layouts an input of a random case may take (``laid_out``); "absent" passes None for an
# optional input.
INPUT_LAYOUTS = ("contiguous", "strided", "offset", "transposed", "padded", "expanded", "absent")


def laid_out(value: torch.Tensor, layout: str, device: str, dtype: torch.dtype) -> torch.Tensor:
    """``value`` on ``device`` as ``dtype``, in memory laid out as ``layout`` says:

    * ``contiguous``;
    * ``strided``: every other element of a buffer twice as wide;
    * ``offset``: one element into its storage, so no 16-byte access is aligned;
    * ``transposed``: the last two axes swapped in memory;
    * ``padded``: rows of a buffer three elements wider (a row stride no vector divides);
    * ``expanded``: the first index along the first axis, broadcast along it (stride 0).

    Memory the view does not cover holds NaN (or, for integers, -7), so a kernel that reads past
    its view shows."""
    shape = tuple(value.shape)
    if layout == "contiguous" or not shape and layout != "offset":
        return value.to(device=device, dtype=dtype)
    if layout == "expanded":
        return value[:1].to(device=device, dtype=dtype).expand(shape)
    if layout == "transposed":
        return value.transpose(-1, -2).to(device=device, dtype=dtype).contiguous().transpose(-1, -2)
    fill = float("nan") if dtype.is_floating_point else -7
    if layout == "offset":
        flat = torch.full((value.numel() + 1,), fill, dtype=dtype, device=device)
        flat[1:] = value.reshape(-1).to(device=device, dtype=dtype)
        return flat[1:].view(shape)
    width = {"strided": 2 * shape[-1], "padded": shape[-1] + 3}[layout]
    buffer = torch.full((*shape[:-1], width), fill, dtype=dtype, device=device)
    view = buffer[..., ::2] if layout == "strided" else buffer[..., :shape[-1]]
    view.copy_(value.to(device=device, dtype=dtype))
    return view


def _inputs_in_layouts(op: OpSpec, case: Case, device: str, generator: torch.Generator) -> List[Optional[torch.Tensor]]:
    shapes = dict(case.shapes)
    layouts = dict(case.input_layouts)
    dtypes = dict(case.input_dtypes)
    tensors: List[Optional[torch.Tensor]] = []
    for t in op.inputs:
        shape = shapes[t.name]
        declared = _declared_dtype(t)
        if declared == torch.int64:
            value = _class_indices(op, case, shape, generator)
        else:
            value = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
        if layouts[t.name] == "absent":
            tensors.append(None)
            continue
        tensors.append(laid_out(value, layouts[t.name], device, declared or dtypes.get(t.name, case.dtype)))
    return tensors


def _class_indices(op: OpSpec, case: Case, shape: Shape, generator: torch.Generator) -> torch.Tensor:
    """int64 inputs are class indices into the op's first static dim; every 4th is ``ignore_index`` if it has one."""
    shapes = dict(case.shapes)
    values = _values(op, shapes, dict(case.params))
    classes = values[op.static_dims[0].name] if op.static_dims else 2
    indices = torch.randint(0, max(classes, 1), shape, generator=generator, dtype=torch.int64)
    if "ignore_index" in values and indices.numel():
        indices.view(-1)[::4] = values["ignore_index"]
    return indices


def build_op(case: Case):
    """The op for a case; instances are shared by cases with one static configuration, as in a model."""
    op = _spec(case.op)
    values = _values(op, dict(case.shapes), dict(case.params))
    static = tuple((d.name, values[d.name]) for d in op.static_dims)
    return _cached_op(case.op, static, case.dtype, case.params)


@functools.lru_cache(maxsize=256)
def _cached_op(name: str, static: Tuple[Tuple[str, int], ...], dtype: torch.dtype, params: Tuple[Tuple[str, Any], ...]):
    import tileops.ops

    return getattr(tileops.ops, name)(**dict(static), dtype=dtype, **dict(params))


def _poison_allocator(nbytes: int, device: str) -> None:
    """Leave NaN-filled blocks in the caching allocator, so an unwritten output shows as NaN."""
    if device != "cuda" or nbytes == 0:
        return
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), device=device) for _ in range(4)]
    del blocks


def check_against_reference(case: Case, device: str = "cuda", seed: int = 0, float32_slack: bool = False,
                            traced: bool = False) -> None:
    """Run the op on random inputs and compare every output with the float64 reference.

    ``float32_slack``: also allow ``SLACK_FACTOR`` times the reference's own error when evaluated
    in float32 (the precision the kernels compute in), for inputs where the result is
    ill-conditioned (a constant row normalised, a norm over two elements) and float32 itself
    lands farther than the dtype's tolerance.  ``traced``: call the op through ``_traced``."""
    spec = _spec(case.op)
    generator = torch.Generator().manual_seed(seed)
    inputs = make_inputs(spec, case, device, generator)
    op = build_op(case)
    call = _traced(op) if traced else op
    expected_shapes = op._infer_output_shapes(*(None if t is None else tuple(t.shape) for t in inputs))
    _poison_allocator(max((torch.Size(s).numel() for s in expected_shapes.values()), default=0) * 4, device)
    outputs = _as_tuple(call(*inputs))
    references = _as_tuple(op.reference(*_widened(inputs, torch.float64)))
    slacks = (_evaluation_errors(references, _as_tuple(op.reference(*_widened(inputs, torch.float32))))
              if float32_slack else [0.0] * len(references))
    assert len(outputs) == len(spec.outputs)
    for tensor, out, ref, slack in zip(spec.outputs, outputs, references, slacks):
        assert tuple(out.shape) == expected_shapes[tensor.name], (tensor.name, out.shape)
        assert out.device.type == torch.device(device).type
        # The kernels and the fake functions give contiguous outputs; a compiled graph checks it.
        assert out.is_contiguous(), (tensor.name, out.stride())
        assert out.dtype == _expected_dtype(spec, tensor.name, inputs, case.params), (tensor.name, out.dtype)
        assert_close(out, ref, coarsest(case.dtype, out.dtype), slack)


def _widened(tensors: Sequence[Optional[torch.Tensor]], dtype: torch.dtype) -> List[Optional[torch.Tensor]]:
    """Copies of the floating-point tensors in ``dtype`` (exact: the inputs' values widen)."""
    return [t.detach().to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]


def _evaluation_errors(exact: Sequence[torch.Tensor], narrower: Sequence[torch.Tensor]) -> List[float]:
    """Per output, the largest difference between its float64 evaluation and a narrower one
    (float32, or the inputs' dtype), over the elements both give finite."""
    errors = []
    for wide, narrow in zip(exact, narrower):
        if not wide.is_floating_point():
            errors.append(0.0)
            continue
        difference = (wide.double() - narrow.double()).abs()
        difference = difference[torch.isfinite(difference)]
        errors.append(difference.max().item() if difference.numel() else 0.0)
    return errors


def _expected_dtype(spec: OpSpec, name: str, inputs: Sequence[Optional[torch.Tensor]],
                    params: Sequence[Tuple[str, Any]] = ()) -> torch.dtype:
    """The dtype its ``dtype_param`` gives (a torch.dtype or its name), else follow ``same_as`` links
    to an input's actual dtype, or take the declared one."""
    given = dict(params).get(spec.tensor(name).dtype_param) if spec.tensor(name).dtype_param else None
    if given is not None:
        return getattr(torch, given) if isinstance(given, str) else given
    by_input = dict(zip(spec.input_names, inputs))
    while spec.tensor(name).dtype.same_as is not None and name not in by_input:
        name = spec.tensor(name).dtype.same_as
    if name in by_input:
        return by_input[name].dtype
    return getattr(torch, spec.tensor(name).dtype.names[0])


def coarsest(*dtypes: torch.dtype) -> torch.dtype:
    """The floating-point dtype of the widest tolerance among ``dtypes`` (others, an index's, have none)."""
    return max((d for d in dtypes if d in TOLERANCE), key=TOLERANCE.__getitem__)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, slack: float = 0.0) -> None:
    """Per-dtype relative tolerance; the absolute floor scales with the result's magnitude, plus
    ``SLACK_FACTOR`` times ``slack`` (``check_against_reference``'s ``float32_slack``).  A reference value
    beyond the range of ``actual``'s dtype is expected as an infinity of its sign."""
    if actual.is_floating_point():
        limit = torch.finfo(actual.dtype).max
        expected = torch.where(expected.abs() > limit, expected.sign() * math.inf, expected)
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    # NaN only where the reference has NaN (a mean over nothing): anywhere else it is unwritten or wrong.
    assert not (torch.isnan(actual) & ~torch.isnan(expected)).any(), "output has NaN (unwritten or wrong)"
    if expected.numel() == 0:
        return
    rtol = TOLERANCE[dtype]
    finite = expected[torch.isfinite(expected)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    atol = rtol * max(scale, 1.0) + SLACK_FACTOR * slack
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def check_gradients(case: Case, device: str = "cuda", seed: int = 0, float32_slack: bool = False,
                    traced: bool = False) -> None:
    """Differentiate the op (a Fwd op the manifest differentiates) and the float64 reference under
    the same random output seeds, rounded to each output's dtype as a gradient reaching it is;
    compare the gradient of every input the op differentiates.  ``float32_slack``: as in
    ``check_against_reference``, and also the error of the reference's gradient evaluated in the
    inputs' dtype, in which PyTorch's derivative formulas (and the manifest's) compute.  A case
    whose reference leaves the range of the outputs' dtype is skipped: its gradient is infinite
    or NaN there, whichever way it is computed.  ``traced``: call the op through ``_traced``."""
    spec = _spec(case.op)
    generator = torch.Generator().manual_seed(seed)
    inputs = make_inputs(spec, case, device, generator)
    positions = _differentiated_positions(case, inputs)
    for i in positions:
        inputs[i].requires_grad_()
    op = build_op(case)
    out_dtypes = [_expected_dtype(spec, t.name, inputs, case.params) for t in spec.outputs]

    def reference_gradients(dtype: torch.dtype) -> List[torch.Tensor]:
        copies = [t.requires_grad_() if i in positions else t for i, t in enumerate(_widened(inputs, dtype))]
        return _seeded_gradients(_as_tuple(op.reference(*copies)), seeds, [copies[i] for i in positions])

    with torch.no_grad():
        exact = _as_tuple(op.reference(*_widened(inputs, torch.float64)))
    if any(dtype.is_floating_point and (torch.isfinite(ref) & (ref.abs() > torch.finfo(dtype).max)).any()
           for ref, dtype in zip(exact, out_dtypes)):
        pytest.skip(f"the forward leaves the range of {case.dtype}")
    seeds = [torch.randn(tuple(ref.shape), generator=generator).to(device=device, dtype=dtype).double()
             if dtype.is_floating_point else None for ref, dtype in zip(exact, out_dtypes)]
    # The references first: a forward built with ``inplace_backward`` writes its gradient over the logits.
    expected = reference_gradients(torch.float64)
    slacks = [0.0] * len(expected)
    if float32_slack:
        # Gradient formulas (an add's, a product's) run in the inputs' dtype, as PyTorch's do.
        for dtype in {torch.float32, case.dtype}:
            slacks = [max(a, b) for a, b in zip(slacks, _evaluation_errors(expected, reference_gradients(dtype)))]
    call = _traced(op) if traced else op
    got = _seeded_gradients(_as_tuple(call(*inputs)), seeds, [inputs[i] for i in positions])
    for i, mine, theirs, slack in zip(positions, got, expected, slacks):
        assert mine.dtype == inputs[i].dtype, (spec.inputs[i].name, mine.dtype)
        assert mine.shape == inputs[i].shape, (spec.inputs[i].name, mine.shape)
        # A backward runs in its outputs' dtype: a float16 ``out_dtype`` of a float32 input, in float16.
        assert_close(mine, theirs, coarsest(case.dtype, *out_dtypes), slack)


def has_gradients(case: Case) -> bool:
    """Whether the case's op is a Fwd op the manifest differentiates (``check_gradients`` applies)."""
    spec = _spec(case.op)
    return spec.direction == "Fwd" and spec.differentiable


def _differentiated_positions(case: Case, inputs: Sequence[Optional[torch.Tensor]]) -> List[int]:
    """Positions of the present inputs the case's op gives gradients to (none unless ``has_gradients``)."""
    if not has_gradients(case):
        return []
    spec = _spec(case.op)
    return [i for i, t in enumerate(spec.inputs) if t.name in spec.differentiated_inputs and inputs[i] is not None]


def _as_tuple(result: Any) -> Tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def _seeded_gradients(outputs: Sequence[torch.Tensor], seeds: Sequence[Optional[torch.Tensor]],
                      leaves: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Gradients of ``sum(output * seed)`` over the floating-point outputs; zeros for a leaf no
    output reaches."""
    total = sum((out.double() * seed).sum() for out, seed in zip(outputs, seeds) if seed is not None)
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if grad is None else grad for leaf, grad in zip(leaves, grads)]


def _traced(op: Any) -> Callable[..., Any]:
    """The op traced by ``torch.compile(dynamic=True, fullgraph=True)`` with ``aot_eager``: the
    custom op, its fake function over symbolic sizes, and for a differentiable Fwd op its
    backward, as torch.compile retraces a graph whose input shapes changed."""
    torch._dynamo.reset()
    return torch.compile(lambda *tensors: op(*tensors), backend="aot_eager", dynamic=True, fullgraph=True)


def check_traced_with_dynamic_shapes(case: Case, device: str = "cpu", seed: int = 0) -> None:
    """``check_against_reference`` and, for a differentiable Fwd op, ``check_gradients`` of the op
    traced with symbolic sizes (``_traced``), float32 slack included: held to the reference's
    tolerance rather than to the eager call's bits, as a traced graph may evaluate a gradient
    formula in another order."""
    check_against_reference(case, device, seed, float32_slack=True, traced=True)
    if has_gradients(case):
        check_gradients(case, device, seed, float32_slack=True, traced=True)
