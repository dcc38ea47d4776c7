"""POST /v1/chat/completions."""

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
from argosy.server.api.protocol import ChatCompletionRequest
from argosy.server.api.server_state import ServerState
from argosy.server.api.streaming import Delta, stream_events, top_k
from argosy.server.engine.input_processor import NewRequest
from argosy.server.exceptions import InvalidRequestError
from argosy.server.outputs import Logprob


async def create_chat_completion(
    body: ChatCompletionRequest, http: HTTPRequest, state: ServerState, client: EngineClient
):
    check_model(body.model, state.model_name)
    params = body.to_sampling_params()
    request_id = new_request_id(http, "chatcmpl")
    tokenizer = client.tokenizer

    def build() -> NewRequest:
        try:
            prompt = tokenizer.apply_chat_template(body.messages, body.add_generation_prompt is not False)
            return client.make_request(engine_request_id(request_id), prompt, params, add_special_tokens=False)
        except InvalidRequestError as exc:  # the prompt a chat call has is its messages
            if exc.param == "prompt":
                exc.param = "messages"
            raise

    request = await prepare(request_id, build)
    gen = Generation(client, request_id, [request])
    base = {"id": request_id, "created": gen.created, "model": state.model_name}
    k = body.top_logprobs or 0

    def logprobs(delta: Delta) -> dict | None:
        if not body.logprobs:
            return None
        return {
            "content": [
                {**token_entry(t, e[t]), "top_logprobs": [token_entry(*alt) for alt in top_k(e, k)]}
                for t, e in zip(delta.token_ids, delta.logprobs)
            ]
        }

    def token_entry(token_id: int, lp: Logprob) -> dict:
        return {"token": lp.decoded_token, "logprob": lp.logprob, "bytes": list(tokenizer.token_bytes(token_id))}

    if body.streaming:

        def chunk(index: int, delta: Delta) -> dict:
            return {
                **base,
                "object": "chat.completion.chunk",
                "usage": None,
                "choices": [
                    {
                        "index": index,
                        "delta": {"content": delta.text} if delta.text else {},
                        "logprobs": logprobs(delta),
                        "finish_reason": delta.finish_reason,
                        "stop_reason": delta.stop_reason,
                    }
                ],
            }

        role = [
            {
                **base,
                "object": "chat.completion.chunk",
                "usage": None,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            for i in range(params.n)
        ]
        usage_chunk = (
            (lambda u: {**base, "object": "chat.completion.chunk", "choices": [], "usage": u})
            if body.include_usage
            else None
        )
        return StreamingResponse(stream_events(gen, params.n, chunk, usage_chunk, role), media_type="text/event-stream")
    finals = await cancel_on_disconnect(http, gen.finals())
    if finals is DISCONNECTED:
        return client_closed()
    (final,) = finals
    choices = [
        {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": logprobs(Delta(c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason)),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        for c in final.outputs
    ]
    return JSONResponse({**base, "object": "chat.completion", "choices": choices, "usage": gen.usage()})
