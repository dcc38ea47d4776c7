"""POST /v1/completions."""

from __future__ import annotations

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.generation import (
    DISCONNECTED,
    Generation,
    cancel_on_disconnect,
    check_model,
    client_closed,
    engine_request_id,
    new_request_id,
    prepare,
)
from argosy.server.api.protocol import CompletionRequest
from argosy.server.api.server_state import ServerState
from argosy.server.api.streaming import Delta, stream_events, token_chars, top_k
from argosy.server.engine.input_processor import NewRequest


async def create_completion(body: CompletionRequest, http: HTTPRequest, state: ServerState, client: EngineClient):
    check_model(body.model, state.model_name)
    params = body.to_sampling_params()
    request_id = new_request_id(http, "cmpl")

    def build() -> tuple[list[NewRequest], list[str]]:
        requests = [
            client.make_request(engine_request_id(request_id, i), prompt, params)
            for i, prompt in enumerate(body.prompts())
        ]
        echoes = [
            (r.prompt if r.prompt is not None else client.tokenizer.decode(r.prompt_token_ids)) if body.echo else ""
            for r in requests
        ]
        return requests, echoes

    requests, echoes = await prepare(request_id, build)
    gen = Generation(client, request_id, requests)
    base = {"id": request_id, "object": "text_completion", "created": gen.created, "model": state.model_name}

    def choice(index: int, delta: Delta) -> dict:
        return {
            "index": index,
            "text": delta.text,
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
            "logprobs": _logprobs(delta, body.logprobs) if body.logprobs is not None else None,
        }

    if body.streaming:
        chunk = lambda index, delta: {**base, "choices": [choice(index, delta)], "usage": None}  # noqa: E731
        usage_chunk = (lambda u: {**base, "choices": [], "usage": u}) if body.include_usage else None
        events = stream_events(gen, params.n, chunk, usage_chunk, prefix=lambda i: echoes[i])
        return StreamingResponse(events, media_type="text/event-stream")
    finals = await cancel_on_disconnect(http, gen.finals())
    if finals is DISCONNECTED:
        return client_closed()
    choices = []
    for i, output in enumerate(finals):
        for c in output.outputs:
            delta = Delta(echoes[i] + c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason)
            delta.offset = len(echoes[i])
            choices.append(choice(i * params.n + c.index, delta))
    return JSONResponse({**base, "choices": choices, "usage": gen.usage()})


def _logprobs(delta: Delta, k: int) -> dict:
    """OpenAI's legacy logprobs: per token its text, log-probability, top-k alternatives and
    character offset in the choice's text."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = delta.offset
    for token_id, entry in zip(delta.token_ids, delta.logprobs or []):
        chosen = entry[token_id]
        offsets.append(offset)
        offset += token_chars(token_id, entry)
        tokens.append(chosen.decoded_token)
        token_logprobs.append(chosen.logprob)
        top.append({lp.decoded_token: lp.logprob for _, lp in [*top_k(entry, k), (token_id, chosen)]})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
