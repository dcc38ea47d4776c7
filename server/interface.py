"""What parts outside the server rely on, each written once: the operator's pods, the Helm
chart's probes, Prometheus and the autoscaler read these names, and the server serves them.
Nothing here imports more than the standard library, so that the operator can read it."""

from __future__ import annotations

SERVER_PORT = 8000  # the API and /metrics, in a pod and by default on a machine
API_KEY_ENV = "ARGOSY_API_KEY"  # the bearer key clients must send
CACHE_ENV = "ARGOSY_CACHE"  # where the embedded default model is converted to

HEALTH_PATH = "/health"  # readiness: the engine can serve now
LIVE_PATH = "/live"  # liveness: the server can still recover by itself
METRICS_PATH = "/metrics"
SLEEP_PATHS = ("/sleep", "/wake_up", "/is_sleeping")  # vLLM's sleep mode, outside /v1

# The gauges the autoscaler reads (each also under vLLM's name, for routers).
WAITING_METRIC = "argosy_num_requests_waiting"
RUNNING_METRIC = "argosy_num_requests_running"
KV_USAGE_METRIC = "argosy_kv_cache_usage_ratio"
GENERATION_TOKENS_METRIC = "argosy_generation_tokens_total"
