"""ChatFormat: how conversations become prompts and tool calls are read back: the chat template
(the checkpoint's, or --chat-template's) and the tool-call format of the model's family (found
in the template, or --tool-call-parser's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from argosy.server.exceptions import ArgosyError, InvalidRequestError
from argosy.server.text.tokenizer import Tokenizer
from argosy.server.tools.family import family_of, tools_template
from argosy.server.tools.parsers import PARSERS, JsonArrayParser, NamedParser, ToolParser
from argosy.server.tools.request import ToolUse


@dataclass(frozen=True)
class ChatFormat:
    template: str | None
    tool_parser: str | None  # the family's format of tool calls; None where unknown

    @classmethod
    def for_model(cls, chat_template: str | None, tool_call_parser: str | None, tokenizer: Tokenizer) -> ChatFormat:
        template = load_chat_template(chat_template) if chat_template else tokenizer.chat_template
        return cls(template, tool_call_parser or family_of(template))

    def prompt(
        self,
        tokenizer: Tokenizer,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool | None,
        tools: ToolUse | None,
        continue_final_message: bool = False,
    ) -> str:
        """The conversation as the template renders it; with `continue_final_message`, cut after the
        final (assistant) message's text, so that the output goes on with it, as vLLM does.
        `add_generation_prompt` None: true, unless the final message is continued."""
        final = _final_text(messages) if continue_final_message else None
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final_message
        if continue_final_message and add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message goes on with the final message: add_generation_prompt must be false",
                param="add_generation_prompt",
            )
        if tools is None:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt, self.template)
        else:
            template = tools_template(self.template, self.tool_parser)
            text = tokenizer.apply_chat_template(messages, add_generation_prompt, template, tools.template_tools())
        if final is None:
            return text
        end = text.rfind(final)
        if end < 0:
            raise InvalidRequestError("the chat template does not show the final message's text", param="messages")
        return text[: end + len(final)]

    def parser(self, tools: ToolUse | None) -> ToolParser | None:
        """What reads the calls of a request's output (None: it makes none)."""
        if tools is None or tools.mode == "none":
            return None
        if tools.mode == "function":
            return NamedParser(tools.name)
        if tools.mode == "required":
            return JsonArrayParser()
        if self.tool_parser is None:
            raise InvalidRequestError(
                "the tool-call format of this model is unknown: start the server with --tool-call-parser, or use "
                "tool_choice required or a named function",
                param="tool_choice",
            )
        return PARSERS[self.tool_parser]()


def _final_text(messages: list[dict[str, Any]]) -> str:
    final = messages[-1] if messages else None
    if not isinstance(final, dict) or final.get("role") != "assistant" or not isinstance(final.get("content"), str):
        raise InvalidRequestError(
            "continue_final_message needs a final assistant message with text content", param="messages"
        )
    return final["content"]


def load_chat_template(value: str) -> str:
    """--chat-template: a file holding the template, or the template itself, as vLLM takes it."""
    path = Path(value)
    if "{" not in value:
        try:
            return path.read_text()
        except OSError as exc:
            raise ArgosyError(f"--chat-template {value}: {exc.strerror or exc}") from exc
    return value
