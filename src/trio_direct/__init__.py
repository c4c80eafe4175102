"""trio-direct: an OpenAI-compatible frontend that serves stock SGLang engines over gRPC."""

__version__ = "0.1.0"
