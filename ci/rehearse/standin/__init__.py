"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` (test infrastructure: it never produces a number a
learner sees). See :mod:`.server`."""
