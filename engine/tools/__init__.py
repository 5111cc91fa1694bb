"""Tools on top of the engine, each a ``python -m engine.tools.NAME`` command: ``bench`` (methods
side by side), ``gpu_check`` (speed and exact-mode figures on a device), ``rsd_sweep`` and
``rsd_breakdown`` (RSD's thresholds and where its time goes), ``synthetic`` (the bundled suites),
and ``agreement`` (where two runs' tokens part, and by what margin)."""
