"""GlobalPointer span extraction (entities, GPLinker relations and events) in JAX / Flax NNX."""

import time as _time

# The interpreter's start, near enough: `python -m gp_jax.X` imports this package before anything else of ours
# (runtime.process_seconds reads it when the process ran something else before it exec'd Python).
IMPORTED_AT = _time.time()
