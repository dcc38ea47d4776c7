"""The Responses API's routes: POST /v1/responses (served as the chat call it reads into), GET and
DELETE /v1/responses/{id}, and POST /v1/responses/{id}/cancel, which only background responses
could take (none are made here). An id the caller's key did not store is not found."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Depends, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from argosy.server.api.chat import chat_build
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.generation import serve_call
from argosy.server.api.openapi_spec import errors, generation_responses
from argosy.server.api.server_state import ServerState
from argosy.server.exceptions import InvalidRequestError
from argosy.server.responses.reply import ResponsesReply
from argosy.server.responses.request import ResponsesRequest, renamed
from argosy.server.responses.store import ResponseStore, StoredResponse, owner_of


class ResponseNotFoundError(InvalidRequestError):
    status = 404


class PreviousResponseNotFoundError(InvalidRequestError):
    code = "previous_response_not_found"  # OpenAI's 400 (vLLM answers 404)


def install_responses_routes(
    app: FastAPI, state: ServerState, store: ResponseStore, serving_engine: Callable[[], EngineClient]
) -> None:
    pin_s = state.config.responses_kv_pin

    def stored(http: HTTPRequest, response_id: str) -> StoredResponse:
        found = store.get(owner_of(http.headers.get("authorization")), response_id)
        if found is None:
            raise ResponseNotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
        return found

    @app.post("/v1/responses", responses=generation_responses())
    async def create(body: ResponsesRequest, http: HTTPRequest, client: EngineClient = Depends(serving_engine)):
        """OpenAI Responses: input items, tools and text.format through the chat template; typed
        server-sent events with stream; stored (store) and continued by previous_response_id."""
        owner = owner_of(http.headers.get("authorization"))
        history: list[dict] = []
        if body.previous_response_id is not None:
            previous = store.get(owner, body.previous_response_id)
            if previous is None:
                raise PreviousResponseNotFoundError(
                    f"Previous response with id '{body.previous_response_id}' not found.", param="previous_response_id"
                )
            history = previous.conversation
        try:
            conversation = body.conversation(history)
            chat = body.chat_request(conversation)

            def reply(gen, params, parser) -> ResponsesReply:
                return ResponsesReply(body, gen, parser, store, owner, conversation)

            pinned = pin_s if body.store is not False and store.enabled else 0.0  # a stored turn goes on
            build = chat_build(chat, state, client)
            return await serve_call(chat, http, state.resolve_model, client, "resp", build, reply, pin_s=pinned)
        except InvalidRequestError as exc:
            raise renamed(exc) from None

    @app.get("/v1/responses/{response_id}", responses=errors(401, 404))
    async def retrieve(response_id: str, http: HTTPRequest) -> dict:
        """A stored response, as it was answered (404 for another key's)."""
        return stored(http, response_id).response

    @app.delete("/v1/responses/{response_id}", responses=errors(401, 404))
    async def delete(response_id: str, http: HTTPRequest) -> dict:
        """Deletes a stored response: it can be neither read nor continued any more."""
        stored(http, response_id)
        store.delete(owner_of(http.headers.get("authorization")), response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel", responses=errors(400, 401, 404, 415))
    async def cancel(response_id: str, http: HTTPRequest) -> Response:
        """Cancels a background response; none are made here, so a stored one is a 400."""
        status = stored(http, response_id).response["status"]
        raise InvalidRequestError(
            f"only background responses can be cancelled; this one is {status}", param="response_id"
        )
