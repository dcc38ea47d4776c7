"""vLLM's utility endpoints: POST /tokenize (a prompt, or a conversation through the chat
template), POST /detokenize, and GET /version."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict

import argosy
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.openapi_spec import errors
from argosy.server.api.server_state import ServerState
from argosy.server.exceptions import InvalidRequestError
from argosy.server.tools.request import read_tools


class TokenizeRequest(BaseModel):
    """A prompt (with add_special_tokens, default true), or messages (rendered by the chat
    template, whose text holds its special tokens: add_special_tokens defaults to false). Fields
    it does not know are ignored, as vLLM's are: routers send their own."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = None  # default true, false with continue_final_message
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    tools: list[Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    tokens: list[int]


def install_tokenize_routes(app: FastAPI, state: ServerState, loaded_engine: Callable[[], EngineClient]) -> None:
    def named_model(model: str | None) -> None:
        if model is not None:
            state.resolve_model(model)  # 404 for a name this server does not serve

    @app.post("/tokenize", responses=errors(400, 401, 404, 503))
    async def tokenize(body: TokenizeRequest, client: EngineClient = Depends(loaded_engine)) -> dict:
        """A prompt or chat messages as the model's token ids, as the server would count them."""
        named_model(body.model)
        tokenizer = client.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("give prompt or messages (one of them)", param="prompt")
        if body.messages is not None:
            tools = read_tools(body.tools, None, None)
            text = state.chat_format.prompt(
                tokenizer, body.messages, body.add_generation_prompt, tools, body.continue_final_message
            )
            tokens = tokenizer.encode(text, bool(body.add_special_tokens))
        else:
            tokens = tokenizer.encode(body.prompt, body.add_special_tokens is not False)
        strs = [tokenizer.token_text(t) for t in tokens] if body.return_token_strs else None
        return {"count": len(tokens), "max_model_len": client.max_model_len, "tokens": tokens, "token_strs": strs}

    @app.post("/detokenize", responses=errors(400, 401, 404, 503))
    async def detokenize(body: DetokenizeRequest, client: EngineClient = Depends(loaded_engine)) -> dict:
        """Token ids back to text."""
        named_model(body.model)
        vocab = client.inputs.vocab_size
        if bad := next((t for t in body.tokens if not 0 <= t < vocab), None):
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": client.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    @app.get("/version")
    async def version() -> dict:
        """The server's version."""
        return {"version": argosy.__version__}
