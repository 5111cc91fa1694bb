"""The runtime layer under the decode loops: the loaded model and its forwards (``model``), a
model with its own cache and cost counters (``cached``), caches of every kind (``cache``: full,
sliding-window, recurrent; forks, rollbacks, holes; ``static``: preallocated slots), the rows of
one batched forward with their holes (``batch``), compiled fixed-shape steps (``compiled``), exact
mode's batch-invariant kernels (``exact``) and the RoPE policy (``rope``). The loops that call it
are in ``engine.methods``."""
