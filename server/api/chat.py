"""POST /v1/chat/completions. With tools, each choice's text is parsed for calls (a ToolStream
per streamed choice), and `finish_reason` is `tool_calls` where the model chose to call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.generation import Generation, engine_request_id, serve_call
from argosy.server.api.protocol import ChatCompletionRequest
from argosy.server.api.server_state import ServerState
from argosy.server.api.streaming import Delta, stream_events, top_k
from argosy.server.engine.input_processor import NewRequest
from argosy.server.engine.request_options import RequestOptions
from argosy.server.exceptions import InvalidRequestError
from argosy.server.outputs import Logprob, RequestOutput
from argosy.server.sampling_params import SamplingParams
from argosy.server.text.tokenizer import Tokenizer
from argosy.server.tools.parsers import Parsed, ToolParser
from argosy.server.tools.tool_stream import ToolStream, call_body, new_call_id


async def create_chat_completion(
    body: ChatCompletionRequest, http: HTTPRequest, state: ServerState, client: EngineClient, render: bool = False
) -> Response:
    """The chat call, or with `render` its engine request as /v1/chat/completions/render shows it."""
    tokenizer = client.tokenizer

    def reply(gen: Generation, params: SamplingParams, parser: ToolParser | None) -> ChatReply:
        tools = body.tool_use
        calls_finish = tools is not None and tools.mode in ("auto", "required")
        return ChatReply(body, gen, params, body.model, tokenizer, parser, calls_finish)

    shown = (lambda entries: entries[0]) if render else None  # one conversation, one request
    return await serve_call(
        body, http, state.resolve_model, client, "chatcmpl", chat_build(body, state, client), reply, shown
    )


def chat_build(
    body: ChatCompletionRequest, state: ServerState, client: EngineClient
) -> Callable[[str, SamplingParams, RequestOptions], tuple[list[NewRequest], ToolParser | None]]:
    """How a chat call makes its engine request (its conversation through the chat template) and
    the parser of its tool calls."""
    tokenizer, chat_format = client.tokenizer, state.chat_format

    def build(
        request_id: str, params: SamplingParams, options: RequestOptions
    ) -> tuple[list[NewRequest], ToolParser | None]:
        tools = body.tool_use  # read with the sampling parameters, off the event loop
        parser = chat_format.parser(tools)  # a format the model cannot use is refused first
        try:
            prompt = chat_format.prompt(
                tokenizer, body.messages, body.add_generation_prompt, tools, body.continue_final_message
            )
            request = client.make_request(engine_request_id(request_id), prompt, params, False, options)
            return [request], parser
        except InvalidRequestError as exc:  # name what a chat call has: messages, top_logprobs
            exc.param = {"prompt": "messages", "logprobs": "top_logprobs"}.get(exc.param, exc.param)
            raise

    return build


class ChatReply:
    def __init__(
        self,
        body: ChatCompletionRequest,
        gen: Generation,
        params: SamplingParams,
        model: str,
        tokenizer: Tokenizer,
        parser: ToolParser | None = None,
        calls_finish: bool = False,  # a choice that calls ends with finish_reason tool_calls
    ):
        self.request, self.gen, self.n, self.tokenizer = body, gen, params.n, tokenizer
        self.parser, self.calls_finish = parser, calls_finish
        self.base = {"id": gen.request_id, "created": gen.created, "model": model}

    def stream(self) -> AsyncIterator[str]:
        base = {**self.base, "object": "chat.completion.chunk"}
        role = [
            {
                **base,
                "usage": None,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
            for i in range(self.n)
        ]

        streams: dict[int, ToolStream] = {}

        def chunk(index: int, delta: Delta) -> dict:
            message, finish_reason = {"content": delta.text} if delta.text else {}, delta.finish_reason
            if self.parser is not None:
                stream = streams.setdefault(index, ToolStream(self.parser))
                content, calls, parsed = stream.feed(delta.text, delta.finish_reason is not None)
                message = {"content": content} if content else {}
                if calls:
                    message["tool_calls"] = calls
                finish_reason = self._finish_reason(finish_reason, parsed)
            return {
                **base,
                "usage": None,
                "choices": [
                    {
                        "index": index,
                        "delta": message,
                        "logprobs": self._logprobs(delta),
                        "finish_reason": finish_reason,
                        "stop_reason": delta.stop_reason,
                    }
                ],
            }

        usage_chunk = (lambda u: {**base, "choices": [], "usage": u}) if self.request.include_usage else None
        return stream_events(self.gen, self.n, chunk, usage_chunk, role)

    def body(self, finals: list[RequestOutput]) -> dict:
        (final,) = finals
        choices = []
        for c in final.outputs:
            message, finish_reason = {"role": "assistant", "content": c.text}, c.finish_reason
            if self.parser is not None:
                parsed = self.parser.parse(c.text, True)
                message["content"] = parsed.content or (None if parsed.calls else "")
                if parsed.calls:
                    message["tool_calls"] = [call_body(call, new_call_id()) for call in parsed.calls]
                finish_reason = self._finish_reason(finish_reason, parsed)
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(Delta(c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason)),
                    "finish_reason": finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
        return {**self.base, "object": "chat.completion", "choices": choices, "usage": self.gen.usage()}

    def _finish_reason(self, engine_reason: str | None, parsed: Parsed) -> str | None:
        """tool_calls where the model chose to call and stopped there; the engine's otherwise."""
        if engine_reason == "stop" and self.calls_finish and parsed.calls:
            return "tool_calls"
        return engine_reason

    def _logprobs(self, delta: Delta) -> dict | None:
        if not self.request.logprobs:
            return None
        k = self.request.top_logprobs or 0
        return {
            "content": [
                {**self._token(t, e[t]), "top_logprobs": [self._token(*alt) for alt in top_k(e, k)]}
                for t, e in zip(delta.token_ids, delta.logprobs)
            ]
        }

    def _token(self, token_id: int, lp: Logprob) -> dict:
        return {"token": lp.decoded_token, "logprob": lp.logprob, "bytes": list(self.tokenizer.token_bytes(token_id))}
