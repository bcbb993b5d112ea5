"""Log-softmax forward and backward kernels: the softmax family's programs with the log variant.

See ``tileops.kernels.softmax.softmax`` for the programs, layouts and configs.
"""

from tileops.kernels.softmax.softmax import SoftmaxFamilyKernel, SoftmaxVariant

__all__ = ["LogSoftmaxFwdKernel", "LogSoftmaxBwdKernel"]


class LogSoftmaxFwdKernel(SoftmaxFamilyKernel):
    """``y = x - max(x) - log(sum(exp(x - max(x))))`` along the axis; ``forward(x, out)``."""

    variant = SoftmaxVariant(backward=False, log=True)


class LogSoftmaxBwdKernel(SoftmaxFamilyKernel):
    """``grad_x = grad_y - exp(y) * sum(grad_y)`` along the axis; ``forward(grad_y, y, out)``."""

    variant = SoftmaxVariant(backward=True, log=True)
