"""Per-op benchmark entries, one module per op (``make gen`` writes each once).

An entry module defines:

``OP``
    The op class name, as in the manifest.
``make_inputs``
    ``None`` for random inputs (normal floats, small positive integers), or a function
    called as ``make_inputs(shapes=..., dtype=..., device=..., params=...)`` where
    ``shapes`` maps each input name to its workload shape, ``dtype`` is the workload's
    ``torch.dtype`` and ``params`` the op's parameter values; it returns the forward
    inputs in order (``None`` for an absent optional input). Use it when random
    normal data is not a valid input (indices, probabilities, sorted keys).
"""
