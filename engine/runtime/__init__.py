"""The runtime layer under the decode loops: caches of every kind (full, sliding-window,
recurrent; forks, rollbacks, holes) and the RoPE policy. A method never asks which kind of
cache or rotary embedding its model has."""
