"""RSD, reward-guided speculative decoding: the step loop (``loop``), who writes, judges and
rewrites each step (``roles``), the step writers behind one interface and the step-end rule
(``writer``; a model on a server gets ``engine.remote.steps.RemoteWriter`` from the registry), the
process reward models that score a step (``prm``) and the acceptance rules that weigh the score
(``acceptance``)."""
