"""The OpenAI-compatible frontend: request lifecycle, HTTP app and serving."""
