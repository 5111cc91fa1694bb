"""The studio's page, one module per tab: each builds its components inside the caller's
``gr.Blocks`` (in the page's order) and returns them in a small dataclass; its events are wired in
the same module, and the wiring that crosses tabs in ``ssr_ui.layout.build_app``.

Modules: ``common`` (what every tab uses), ``endpoints`` (the jobs that use the model: their API
signatures and bounds), ``run`` and ``settings`` (the Run tab and its settings), ``benchmark``,
``history``. Imports go one way: ``ssr_ui.layout`` -> ``ssr_ui.tabs`` -> ``ssr_ui.handlers``,
``ssr_ui.render`` and the engine. The logic the tabs' events run lives in plain module-level
functions, tested without a browser (``tests/test_layout_logic.py``).
"""
