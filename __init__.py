"""docqa: local document analysis with an embedded long-context LLM engine."""

__version__ = "0.1.0"
