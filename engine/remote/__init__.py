"""The serving-engine backend: the methods against a vLLM server instead of an in-process model."""
