"""RSD, reward-guided speculative decoding: the step loop (``loop``), the process reward models
that score a step (``prm``) and the acceptance rules that weigh the score (``acceptance``)."""
