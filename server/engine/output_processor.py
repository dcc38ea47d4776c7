"""OutputProcessor: the API side of the engine's outputs. It follows each request in flight,
turns the core's new tokens into text (incrementally), logprob entries and finish reasons,
finds stop strings (and names the sequences they end, so that the core stops them), and
builds the RequestOutputs the caller sees. What fails here for one request (detokenizing its
tokens, building its output) fails that request alone: it is forgotten, and `take_failed`
names it, so that the caller ends it and has the core abort it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from argosy.server.engine.core_protocol import EngineCoreOutput, TokenLogprobs
from argosy.server.engine.input_processor import NewRequest
from argosy.server.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from argosy.server.sampling_params import RequestOutputKind
from argosy.server.text.detokenizer import IncrementalDetokenizer, make_detokenizer
from argosy.server.text.tokenizer import Tokenizer

log = logging.getLogger("argosy.engine")


@dataclass
class SequenceState:
    detokenizer: IncrementalDetokenizer
    # Every token and logprob entry so far; for DELTA outputs, only those not yet handed out
    # (what was handed out is the caller's: a stream holds no history it will not send).
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    num_tokens: int = 0
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_chars: int = 0  # of the text, handed out by earlier DELTA outputs


@dataclass
class RequestState:
    request: NewRequest
    seqs: dict[int, SequenceState] = field(default_factory=dict)
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    num_finished: int = 0  # sequences with a finish reason
    kv_transfer_params: dict | None = None  # what its answer tells a decode replica, once finished

    @property
    def finished(self) -> bool:
        return self.num_finished == self.request.params.n


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}
        self._failed: dict[str, str] = {}  # request id -> why, until taken
        tokenizer.load_vocab_tables()  # now, rather than on the first request

    def add(self, request: NewRequest) -> None:
        self.requests[request.request_id] = RequestState(request, metrics=RequestMetrics(request.arrival_time))

    def abort(self, request_id: str) -> bool:
        """Forgets a request; False if it was not in flight."""
        return self.requests.pop(request_id, None) is not None

    def abort_outputs(self, request_id: str) -> list[EngineCoreOutput]:
        """Outputs that end every unfinished sequence of a request with finish_reason "abort"
        (the server ends it, and its caller is to be told so): process them as the core's."""
        state = self.requests.get(request_id)
        if state is None:
            return []
        return [
            EngineCoreOutput(request_id, index, [], finish_reason="abort")
            for index in range(state.request.params.n)
            if index not in state.seqs or state.seqs[index].finish_reason is None
        ]

    def process(self, outputs: list[EngineCoreOutput], now: float) -> tuple[list[RequestOutput], list[tuple[str, int]]]:
        """The RequestOutputs of the requests that moved, and the sequences that a stop string
        ended while the core still runs them."""
        moved: dict[str, RequestState] = {}
        stopped: list[tuple[str, int]] = []
        for out in outputs:
            state = self.requests.get(out.request_id)
            if state is None:  # aborted, failed, or ended by a stop string before the core knew
                continue
            try:
                seq = state.seqs.get(out.index) or self._start(state, out, now)
                if seq.finish_reason is None:
                    if self._append(state, seq, out):
                        stopped.append((out.request_id, out.index))
                    moved[out.request_id] = state
            except Exception as exc:
                self._fail(out.request_id, "detokenizing its output", exc)
        results = []
        for request_id, state in moved.items():
            if request_id not in self.requests:  # failed above
                continue
            finished = state.finished
            if finished:
                state.metrics.finished_time = now
            kind = state.request.params.output_kind
            if finished or kind is not RequestOutputKind.FINAL_ONLY:
                try:
                    results.append(self._request_output(state, finished, kind))
                except Exception as exc:
                    self._fail(request_id, "building its output", exc)
                    continue
            if finished:
                del self.requests[request_id]
        return results, [s for s in stopped if s[0] not in self._failed]

    def take_failed(self) -> dict[str, str]:
        """The requests that failed here since the last call, and why."""
        failed, self._failed = self._failed, {}
        return failed

    def _fail(self, request_id: str, doing: str, exc: Exception) -> None:
        log.exception("request %s failed while %s", request_id, doing)
        del self.requests[request_id]
        self._failed[request_id] = f"{doing} failed: {type(exc).__name__}: {exc}"

    def _start(self, state: RequestState, out: EngineCoreOutput, now: float) -> SequenceState:
        request, p = state.request, state.request.params
        detokenizer = make_detokenizer(
            self.tokenizer,
            request.prompt_token_ids,
            p.skip_special_tokens,
            p.stop_strings,
            p.include_stop_str_in_output,
        )
        seq = state.seqs[out.index] = SequenceState(detokenizer)
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
            state.metrics.first_scheduled_time = out.first_scheduled_time
            state.num_cached_tokens = out.num_cached_tokens
        return seq

    def _append(self, state: RequestState, seq: SequenceState, out: EngineCoreOutput) -> bool:
        """Adds the new tokens up to the first that ends the sequence (the core's reason holds for
        its last token); True if a stop string ended a sequence the core still runs."""
        params, last = state.request.params, len(out.new_token_ids) - 1
        if out.kv_transfer_params is not None:
            state.kv_transfer_params = out.kv_transfer_params.answer()
        if last < 0 and out.finish_reason is not None:  # ended with no new token: aborted
            seq.finish_reason = out.finish_reason
            state.num_finished += 1
            seq.detokenizer.flush()
            return False
        for i, token_id in enumerate(out.new_token_ids):
            seq.token_ids.append(token_id)
            seq.num_tokens += 1
            if out.logprobs is not None:
                seq.logprobs.append(self._logprob_entry(out.logprobs[i]))
                seq.cumulative_logprob += out.logprobs[i].logprob
            stop_string = seq.detokenizer.add(token_id, check_stop=params.may_stop(seq.num_tokens))
            reason = out.finish_reason if i == last else None
            if reason == "stop":  # eos and stop tokens rank before stop strings
                seq.finish_reason, seq.stop_reason = reason, out.stop_reason
            elif stop_string is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop_string
            elif reason is not None:
                seq.finish_reason = reason
            if seq.finish_reason is not None:
                state.num_finished += 1
                if stop_string is None:
                    seq.detokenizer.flush()
                return stop_string is not None and out.finish_reason is None
        return False

    def _request_output(self, state: RequestState, finished: bool, kind: RequestOutputKind) -> RequestOutput:
        wanted = state.request.params.logprobs is not None
        outputs = []
        for index, seq in sorted(state.seqs.items()):
            text = seq.detokenizer.output_text(seq.finish_reason is not None)
            tokens, logprobs = seq.token_ids, seq.logprobs
            if kind is RequestOutputKind.DELTA:
                text, seq.sent_chars = text[seq.sent_chars :], len(text)
                seq.token_ids, seq.logprobs = [], []
            elif kind is RequestOutputKind.CUMULATIVE:  # the lists still grow after this output
                tokens, logprobs = list(tokens), list(logprobs)
            outputs.append(
                CompletionOutput(
                    index,
                    text,
                    tokens,
                    seq.cumulative_logprob if wanted else None,
                    logprobs if wanted else None,
                    seq.finish_reason,
                    seq.stop_reason,
                )
            )
        request = state.request
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            outputs,
            finished,
            state.num_cached_tokens,
            state.metrics,
            state.kv_transfer_params,
        )

    def _logprob_entry(self, lp: TokenLogprobs) -> dict[int, Logprob]:
        text = self.tokenizer.token_text
        entry = {lp.token_id: Logprob(lp.logprob, lp.rank, text(lp.token_id))}
        for rank, (token_id, value) in enumerate(lp.top, start=1):
            entry.setdefault(token_id, Logprob(value, rank, text(token_id)))
        return entry
