"""SSR, self-speculation for reasoning models: the loop (``loop``: phase A over rows, phase B by
verification), the rows of phase A (``rows``), its proposers and the suffix index they match
against (``proposers``, ``suffix_index``)."""
