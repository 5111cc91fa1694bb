"""The decoding methods: loops that read top to bottom and know nothing of how a forward runs.

``baseline`` (plain decoding) and ``peers`` (transformers' ``generate()`` and its prompt lookup) beside
``ssr/`` (self-speculation: the loop, its proposers, the suffix index) and ``rsd/`` (reward-guided
speculative decoding: the loop, the PRMs, the acceptance rules); ``sampling`` (choosing and verifying
tokens), ``budget`` (the reasoning budget and its forced end) and ``recorder`` (turning a loop's
steps into events) serve them all. A method is handed its
model (in process: ``engine.runtime``; on a server: ``engine.remote``) by ``engine.registry``, and
never imports a backend.
"""
