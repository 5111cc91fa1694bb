"""SSR, self-speculation for reasoning models: the loop (``loop``), its proposers and the suffix
index they match against (``proposers``, ``suffix_index``)."""
