"""OpenAI's Responses API (/v1/responses): a request read into the chat call that serves it,
its output as typed items and events, and the bounded store that continues a conversation by
`previous_response_id`."""
