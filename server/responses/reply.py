"""How a Responses call answers: one Response object, or its typed server-sent events (created,
in_progress, then per item added, deltas, done, then completed or incomplete), each numbered;
either way the finished response is stored with the conversation it continues."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from itertools import count

from argosy.server.api.error_responses import to_api_error
from argosy.server.api.generation import Generation
from argosy.server.outputs import RequestOutput
from argosy.server.responses.output import OutputItems, new_id, response_object, usage
from argosy.server.responses.request import ResponsesRequest
from argosy.server.responses.store import ResponseStore
from argosy.server.tools.parsers import Call, Parsed, ToolParser
from argosy.server.tools.tool_stream import ToolStream, new_call_id


class ResponsesReply:
    def __init__(
        self,
        request: ResponsesRequest,
        gen: Generation,
        parser: ToolParser | None,
        store: ResponseStore,
        owner: str,
        conversation: list[dict],
    ):
        self.request, self.gen, self.parser, self.store, self.owner = request, gen, parser, store, owner
        self.conversation = conversation  # this turn's messages after the earlier turns', no instructions
        self.id = new_id("resp")
        self.storing = request.store is not False and store.enabled

    def response(self, status: str, items: OutputItems, with_usage: bool = True) -> dict:
        chat_usage = usage(self.gen.usage()) if with_usage else None
        response = response_object(
            self.request, self.id, self.gen.created, status, items.items, chat_usage, self.storing
        )
        return response | {"weight_version": self.gen.weight_version}  # as every generation call's body has it

    def finish(self, status: str, items: OutputItems) -> dict:
        response = self.response(status, items)
        if self.storing:
            self.store.put(self.owner, response, [*self.conversation, items.chat_message()])
        return response

    def body(self, finals: list[RequestOutput]) -> dict:
        (final,) = finals
        choice = final.outputs[0]
        parsed = self.parser.parse(choice.text, True) if self.parser is not None else Parsed(choice.text)
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        items = OutputItems()
        if parsed.content or not parsed.calls:
            items.message(parsed.content, status)
        for call in parsed.calls:
            items.call(call, new_call_id(), "completed")
        return self.finish(status, items)

    async def stream(self) -> AsyncIterator[str]:
        numbers = count()

        def event(kind: str, **fields) -> str:
            payload = {"type": kind, "sequence_number": next(numbers), **fields}
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        items = OutputItems()
        started = self.response("in_progress", items, with_usage=False)
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        tools = ToolStream(self.parser) if self.parser is not None else None
        message: dict | None = None  # the message item being written
        calls: list[dict] = []  # the function_call items, in their order
        status = "completed"

        def close_message() -> list[str]:
            nonlocal message
            if message is None:
                return []
            where = {"item_id": message["id"], "output_index": items.items.index(message), "content_index": 0}
            part = message["content"][0]
            message["status"] = "incomplete" if status == "incomplete" else "completed"
            done, message = message, None
            return [
                event("response.output_text.done", **where, text=part["text"], logprobs=[]),
                event("response.content_part.done", **where, part=part),
                event("response.output_item.done", output_index=where["output_index"], item=done),
            ]

        try:
            async for _, output in self.gen.outputs():
                choice = output.outputs[0]
                final = choice.finish_reason is not None
                if choice.finish_reason == "length":
                    status = "incomplete"
                content, deltas = (choice.text, []) if tools is None else tools.feed(choice.text, final)[:2]
                if content:
                    if message is None:
                        message = items.message()
                        index = len(items.items) - 1
                        yield event("response.output_item.added", output_index=index, item=message)
                        where = {"item_id": message["id"], "output_index": index, "content_index": 0}
                        yield event("response.content_part.added", **where, part=dict(message["content"][0]))
                    message["content"][0]["text"] += content
                    where = {"item_id": message["id"], "output_index": items.items.index(message), "content_index": 0}
                    yield event("response.output_text.delta", **where, delta=content, logprobs=[])
                for delta in deltas:
                    if "id" in delta:  # a new call: what came before it is done
                        for done in close_message():
                            yield done
                        function = delta["function"]
                        item = items.call(Call(function["name"], ""), delta["id"])
                        calls.append(item)
                        yield event("response.output_item.added", output_index=len(items.items) - 1, item=dict(item))
                    item = calls[delta["index"]]
                    fragment = delta["function"].get("arguments") or ""
                    if fragment:
                        item["arguments"] += fragment
                        where = {"item_id": item["id"], "output_index": items.items.index(item)}
                        yield event("response.function_call_arguments.delta", **where, delta=fragment)
            for done in close_message():
                yield done
            for item in calls:
                item["status"] = "completed"
                where = {"item_id": item["id"], "output_index": items.items.index(item)}
                yield event(
                    "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
                )
                yield event("response.output_item.done", output_index=where["output_index"], item=item)
            yield event(f"response.{status}", response=self.finish(status, items))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = to_api_error(exc)
            yield event("error", code=error.code, message=error.message, param=error.param)
            failed = self.response("failed", items) | {"error": {"code": "server_error", "message": error.message}}
            yield event("response.failed", response=failed)
