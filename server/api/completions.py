"""POST /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.generation import Generation, engine_request_id, serve_call
from argosy.server.api.protocol import CompletionRequest
from argosy.server.api.server_state import ServerState
from argosy.server.api.streaming import Delta, stream_events, token_chars, top_k
from argosy.server.engine.input_processor import NewRequest
from argosy.server.engine.request_options import RequestOptions
from argosy.server.outputs import RequestOutput
from argosy.server.sampling_params import SamplingParams


async def create_completion(
    body: CompletionRequest, http: HTTPRequest, state: ServerState, client: EngineClient, render: bool = False
) -> Response:
    """The completions call, or with `render` its engine requests as /v1/completions/render shows them."""

    def build(request_id: str, params: SamplingParams, options: RequestOptions) -> tuple[list[NewRequest], list[str]]:
        requests = [
            client.make_request(engine_request_id(request_id, i), prompt, params, True, options)
            for i, prompt in enumerate(body.prompts())
        ]
        echoes = [
            (r.prompt if r.prompt is not None else client.tokenizer.decode(r.prompt_token_ids)) if body.echo else ""
            for r in requests
        ]
        return requests, echoes

    def reply(gen: Generation, params: SamplingParams, echoes: list[str]) -> CompletionReply:
        return CompletionReply(body, gen, params, body.model, echoes)

    return await serve_call(body, http, state.resolve_model, client, "cmpl", build, reply, list if render else None)


class CompletionReply:
    def __init__(self, body: CompletionRequest, gen: Generation, params: SamplingParams, model: str, echoes: list[str]):
        self.request, self.gen, self.n, self.echoes = body, gen, params.n, echoes
        self.base = {"id": gen.request_id, "object": "text_completion", "created": gen.created, "model": model}

    def stream(self) -> AsyncIterator[str]:
        def chunk(index: int, delta: Delta) -> dict:
            return {**self.base, "choices": [self._choice(index, delta)], "usage": None}

        usage_chunk = (lambda u: {**self.base, "choices": [], "usage": u}) if self.request.include_usage else None
        return stream_events(self.gen, self.n, chunk, usage_chunk, prefix=lambda i: self.echoes[i])

    def body(self, finals: list[RequestOutput]) -> dict:
        choices = []
        for i, output in enumerate(finals):
            for c in output.outputs:
                delta = Delta(self.echoes[i] + c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason)
                delta.offset = len(self.echoes[i])
                choices.append(self._choice(i * self.n + c.index, delta))
        return {**self.base, "choices": choices, "usage": self.gen.usage()}

    def _choice(self, index: int, delta: Delta) -> dict:
        logprobs = self.request.logprobs
        return {
            "index": index,
            "text": delta.text,
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
            "logprobs": _logprobs(delta, logprobs) if logprobs is not None else None,
        }


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
