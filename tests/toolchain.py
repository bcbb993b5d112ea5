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


def ptxas_report(source: str, tmp_dir: str) -> "dict[str, int]":
    """Registers and spilled bytes of the one kernel in ``source`` (TileLang's CUDA), built for sm_90a."""
    import re
    import subprocess

    import tilelang.env as tilelang_env

    path = os.path.join(tmp_dir, "kernel.cu")
    with open(path, "w") as handle:
        handle.write(source)
    command = ["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-std=c++17", "-DENABLE_BF16", "--resource-usage",
               f"-I{tilelang_env.TILELANG_TEMPLATE_PATH}", f"-I{tilelang_env.CUTLASS_INCLUDE_DIR}",
               "-o", os.path.join(tmp_dir, "kernel.cubin"), path]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    report = result.stdout + result.stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert registers and spills, report
    return {"registers": int(registers.group(1)), "spill_bytes": int(spills.group(1)) + int(spills.group(2))}


def divisions_at_accesses(source: str) -> "list[str]":
    """Lines of TileLang's CUDA ``source`` that divide (or take a remainder) by a runtime value in
    64-bit arithmetic anywhere but in a plain assignment to a local.

    Such a division is a software routine of about a hundred instructions; inside an index
    expression it runs at every access (a middle-axis scan lost half its speed to it).  Worked
    out once into a local, it costs nothing that matters.
    """
    import re

    division = re.compile(r"[/%] \(*\(int64_t\)\(*[A-Za-z_]")
    local = re.compile(r"^\s*(?:int64_t \w+|\w+\[\d+\]) = ")
    return [line.strip() for line in source.splitlines() if division.search(line) and not local.match(line)]
