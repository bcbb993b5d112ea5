"""Every kernel family remembers its launchers per config, and forgets them when the config changes.

Tuning assigns ``Kernel.config``; a launcher kept from the previous config would launch
the old program.  The compile step is replaced by a stand-in that counts its calls.
"""

from typing import Any, Callable, List, Tuple

import pytest
import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.loss.cross_entropy import CrossEntropyBwdKernel, CrossEntropyFwdKernel
from tileops.kernels.norm.layer_norm import LayerNormFwdKernel
from tileops.kernels.norm.rms_norm import RMSNormFwdKernel
from tileops.kernels.norm.rms_norm_bwd import RMSNormBwdKernel
from tileops.kernels.reduction.reduce import SumKernel
from tileops.kernels.scan.cumsum import ROW_SCAN, CumsumFwdKernel
from tileops.kernels.softmax.softmax import ROW_FUSED, SoftmaxFwdKernel

class _StandIn:
    """A compiled program that remembers, on the tensors it was given, that it launched."""

    def __call__(self, *tensors: torch.Tensor) -> None:
        tensors[-1].launched_by = self


def _launched_by(forward: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    forward(*tensors)
    return tensors[-1].launched_by


# (kernel factory, the compile method a launcher comes from, one launcher lookup)
CASES: List[Tuple[str, Callable[[], Kernel], str, Callable[[Any], Any]]] = [
    ("softmax", lambda: SoftmaxFwdKernel(4096, torch.bfloat16), "compile_program",
     lambda k: k._launcher(ROW_FUSED, (("vector", 8),))),
    ("rms_norm_fwd", lambda: RMSNormFwdKernel(4096, torch.bfloat16), "compile_program", lambda k: _launched_by(
        k.forward, torch.empty(2, 4096), torch.empty(4096), torch.empty(2, 4096))),
    ("rms_norm_bwd", lambda: RMSNormBwdKernel(4096, torch.bfloat16), "compile_program",
     lambda k: k.launcher(k.main_program())),
    ("layer_norm_fwd", lambda: LayerNormFwdKernel(4096, torch.float16), "compile_program",
     lambda k: k.launcher(k.main_program())),
    ("cumsum", lambda: CumsumFwdKernel(4096, torch.float32), "compile_program", lambda k: k._launcher(ROW_SCAN)),
    ("cross_entropy_fwd", lambda: CrossEntropyFwdKernel(32000, torch.bfloat16), "_compile_main",
     lambda k: k._launcher()),
    ("cross_entropy_bwd", lambda: CrossEntropyBwdKernel(32000, torch.bfloat16), "_compile_main",
     lambda k: k._launcher(has_grad_lse=False, mean=True, per_row=False)),
    ("sum", lambda: SumKernel(torch.bfloat16), "compile_program", lambda k: k._launcher("rows", (("vector", 8),))),
]


@pytest.mark.parametrize("make, compile_method, lookup", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_launchers_are_remembered_per_config_and_a_new_config_forgets_them(
        make: Callable[[], Kernel], compile_method: str, lookup: Callable[[Any], Any]) -> None:
    kernel = make()
    compiled: List[_StandIn] = []

    def stand_in(*args: Any, **kwargs: Any) -> _StandIn:
        compiled.append(_StandIn())
        return compiled[-1]

    setattr(kernel, compile_method, stand_in)
    first = lookup(kernel)
    assert lookup(kernel) is first and compiled == [first]
    kernel.config = dict(kernel.config)  # a new config object, as tuning assigns
    second = lookup(kernel)
    assert second is not first and compiled == [first, second]
    assert lookup(kernel) is second
