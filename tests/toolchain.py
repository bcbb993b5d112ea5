"""Whether this machine can build kernels for sm_90: tilelang imports and nvcc is on the PATH.

Build checks carry ``needs_nvcc``.  A contributor's machine without the toolchain
skips them; under CI (``CI`` set, as ``.ci/run`` does) they always run, so a
broken toolchain fails loudly instead of passing as skipped.
"""

import os
import shutil

import pytest


def toolchain_available() -> bool:
    try:
        import tilelang  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "cannot build here"
        return False
    return shutil.which("nvcc") is not None


needs_nvcc = pytest.mark.skipif(not os.environ.get("CI") and not toolchain_available(),
                                reason="building kernels needs tilelang and nvcc")
