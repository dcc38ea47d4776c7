"""ServerConfig: every setting of `argosy serve` beyond the engine's, with its flag's default
and help, and the engine's own EngineConfig."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from argosy.flags import setting
from argosy.server.api.request_stream import StreamLimits
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import ArgosyError, InvalidRequestError
from argosy.server.interface import API_KEY_ENV, SERVER_PORT
from argosy.server.models.default_model import DEFAULT_MODEL_NAME

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's, which KubeAI and AIBrix set


@dataclass
class ServerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(SERVER_PORT, "port to listen on (the API and /metrics)")
    headless: bool = setting(
        False,
        "a node of a model served across nodes that runs its ranks only, for the leader at --master-addr (with "
        "--nnodes and --node-rank above 0): no API server; the engine's settings come from the leader",
    )
    api_key: str | None = setting(None, "bearer key required on /v1/*", env=API_KEY_ENV)
    api_key_file: str | None = setting(None, "file holding the bearer key (a mounted Secret stays out of ps)")
    max_waiting_requests: int = setting(1024, "queued requests beyond which new ones get 503 + Retry-After")
    shutdown_timeout: float = setting(60.0, "seconds requests in flight may take to finish after SIGTERM")
    max_request_body_bytes: int = setting(8 << 20, "larger request bodies get 413")
    header_timeout: float = setting(10.0, "seconds a client may take to send a request's headers (then 408)")
    body_timeout: float = setting(30.0, "seconds a client may take to send a request's body after them (then 408)")
    max_connections: int = setting(2048, "open connections beyond which new ones get 503 and are closed")
    max_unread_tokens: int = setting(
        1 << 14, "a request whose client leaves more output tokens unread (logprobs included) is aborted"
    )
    stream_stall_timeout: float = setting(60.0, "seconds a request's output may wait unread before it is aborted")
    engine_step_timeout: float = setting(
        120.0,
        "seconds the engine core may go without finishing a step while it holds work, or without answering a "
        "ping while idle, before it counts as hung: it is killed, what is in flight fails, and the server exits 70",
    )
    log_format: Literal["json", "text"] = setting("json", "one JSON object per line, or text")
    responses_store_entries: int = setting(
        1024, "responses kept for GET /v1/responses/{id} and previous_response_id (0: none are stored)"
    )
    responses_store_bytes: int = setting(64 << 20, "bytes of stored responses and their conversations at most")
    responses_store_ttl: float = setting(3600.0, "seconds a stored response is kept")
    responses_kv_pin: float = setting(
        300.0,
        "seconds a stored response's KV blocks stay ahead of others in the prefix cache's eviction order, so that "
        "its conversation's next turn finds them (0: not pinned; at most half the cache is pinned at once)",
    )
    lora_modules: list[str] = setting(
        [], 'a LoRA adapter served from the start: NAME=PATH, or JSON {"name": ..., "path": ...}'
    )
    allow_runtime_lora_updating: bool = setting(
        False, "serve /v1/load_lora_adapter and /v1/unload_lora_adapter", env=RUNTIME_LORA_ENV
    )
    lora_config_file: str | None = setting(
        None,
        'a file listing the adapters to serve (JSON: [{"name", "path"}]), watched: adapters added, removed or '
        "changed there are loaded, unloaded or reloaded",
    )

    enable_weight_updates: bool = setting(
        False, "serve /v1/update_weights_from_disk: new weights swapped in while serving (RL loops)"
    )
    enable_sleep_mode: bool = setting(
        False, "serve /sleep, /wake_up and /is_sleeping: the KV cache and weights freed for a trainer on the GPU"
    )
    chat_template: str | None = setting(
        None, "the chat template, a file or the template itself; default: the checkpoint's"
    )
    tool_call_parser: Literal["hermes", "smollm2", "llama3_json"] | None = setting(
        None, "the format the model writes tool calls in; default: found from its chat template"
    )
    enable_auto_tool_choice: bool = setting(
        True, "accepted for vLLM's command lines: tool_choice auto is always served where the format is known"
    )
    ssl_keyfile: str | None = setting(None, "the TLS private key: serve HTTPS (with --ssl-certfile)")
    ssl_certfile: str | None = setting(None, "the TLS certificate chain: serve HTTPS (with --ssl-keyfile)")
    root_path: str = setting(
        "", "the path prefix a proxy serves this server under, stripping it (the API docs name it)"
    )
    allowed_origins: list[str] = setting(
        [],
        'CORS origins allowed (a JSON list, as vLLM takes it, or repeated; "*" for any); default none: '
        "no browser page of another origin may call the API (vLLM allows any)",
    )
    allowed_methods: list[str] = setting([], 'CORS methods allowed, with --allowed-origins; default ["*"]')
    allowed_headers: list[str] = setting([], 'CORS headers allowed, with --allowed-origins; default ["*"]')
    allow_credentials: bool = setting(False, "CORS: allow credentials (cookies, authorization headers)")
    enable_log_requests: bool = setting(False, "log each request: its id, prompt, token ids and sampling parameters")
    max_log_len: int | None = setting(None, "characters and token ids of a prompt that a request's log line shows")

    def __post_init__(self) -> None:
        self.allowed_origins = _json_or_list(self.allowed_origins, "allowed_origins")
        for name in ("allowed_methods", "allowed_headers"):
            setattr(self, name, _json_or_list(getattr(self, name), name) or ["*"])
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise InvalidRequestError("give --ssl-keyfile and --ssl-certfile together", param="ssl_certfile")
        if isinstance(self.allow_runtime_lora_updating, str):  # from the environment
            self.allow_runtime_lora_updating = self.allow_runtime_lora_updating.strip().lower() in ("1", "true", "yes")
        for name in ("lora_modules", "lora_config_file", "allow_runtime_lora_updating"):
            if getattr(self, name) and not self.engine.enable_lora:
                raise InvalidRequestError(f"{name} needs LoRA on (--enable-lora)", param=name)
        if not self.engine_step_timeout > 0:
            raise InvalidRequestError(
                f"engine_step_timeout must be positive, got {self.engine_step_timeout}", param="engine_step_timeout"
            )

    @property
    def model_name(self) -> str:
        return self.engine.served_model_name or self.engine.model or DEFAULT_MODEL_NAME

    @property
    def stream_limits(self) -> StreamLimits:
        return StreamLimits(self.max_unread_tokens, self.stream_stall_timeout)


def _json_or_list(values: list[str], name: str) -> list[str]:
    """Values given as repeated flags, or as one JSON list (vLLM's form)."""
    if len(values) == 1 and values[0].lstrip().startswith("["):
        try:
            parsed = json.loads(values[0])
        except ValueError as exc:
            raise InvalidRequestError(f"{name}: not a JSON list: {exc}", param=name) from exc
        if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
            raise InvalidRequestError(f"{name} must be a list of strings", param=name)
        return parsed
    return list(values)


def resolve_api_key(config: ServerConfig) -> str | None:
    """The key from --api-key (or its environment variable), or read from --api-key-file; not both."""
    if config.api_key_file is None:
        return config.api_key
    if config.api_key:
        raise ArgosyError(f"give --api-key (or {API_KEY_ENV}) or --api-key-file, not both")
    try:
        key = Path(config.api_key_file).read_text().strip()
    except OSError as exc:
        raise ArgosyError(f"--api-key-file {config.api_key_file}: {exc.strerror or exc}") from exc
    if not key:
        raise ArgosyError(f"--api-key-file {config.api_key_file}: the file is empty")
    return key
