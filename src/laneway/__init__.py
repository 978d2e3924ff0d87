"""laneway: a priority scheduler and OpenAI-compatible gateway for LLM inference."""

__version__ = "0.1.0"
