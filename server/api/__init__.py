"""The OpenAI-compatible HTTP server: FastAPI routes, the background engine loop,
Prometheus metrics, and `argosy serve`."""
