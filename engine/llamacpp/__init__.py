"""llama.cpp as a runtime beneath the same methods: a GGUF file run by llama.cpp's own kernels
(llama-cpp-python's low-level API), with SSR's rows as llama.cpp sequences (forks by ``seq_cp``,
rollbacks by ``seq_rm``). Optional: ``requirements-llama.txt`` builds it."""
