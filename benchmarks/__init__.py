"""``make bench``: every implemented op on every manifest workload, against PyTorch.

``python -m benchmarks`` measures the device's ceilings (copy bandwidth, dense matmul
rate), then times each op's CUDA path, its manifest ``reference`` in eager PyTorch and
the reference under ``torch.compile`` (Bwd ops: against autograd of the paired Fwd
reference), and writes ``benchmarks/results/<gpu>.csv`` (appended), ``<gpu>.md`` and
``<gpu>.png``. ``python -m benchmarks.readme`` renders the README's results block from
the committed CSV; ``python -m benchmarks.compare CSV`` shows how two runs differ.

Modules: ``metrics`` (arithmetic), ``timing`` (device timer, memory probe),
``ceilings``, ``workloads`` (cases and inputs), ``checking`` (output comparison),
``variants`` (what is timed), ``runner``, ``results`` (CSV and Markdown), ``plot``,
``readme``, ``compare``.
"""
