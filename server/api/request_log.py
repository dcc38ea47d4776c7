"""--enable-log-requests: one log line per engine request as it is queued, with its prompt (its
text and token ids, cut to --max-log-len) and its sampling parameters, as vLLM logs them."""

from __future__ import annotations

import dataclasses
import logging

from argosy.server.engine.input_processor import NewRequest

log = logging.getLogger("argosy.requests")


class RequestLog:
    def __init__(self, max_len: int | None):
        self.max_len = max_len

    def received(self, request: NewRequest) -> None:
        cut = slice(None, self.max_len)
        params = {k: v for k, v in dataclasses.asdict(request.params).items() if k != "stop_strings"}
        fields = {
            "request_id": request.request_id,
            "prompt": None if request.prompt is None else request.prompt[cut],
            "prompt_token_ids": request.prompt_token_ids[cut],
            "params": params,
            "lora": None if request.core.options.lora is None else request.core.options.lora.name,
        }
        log.info("received request %s", request.request_id, extra={"fields": fields})
