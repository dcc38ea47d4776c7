"""OutputProcessor: appends each sampled token to its sequence, decides whether the
sequence is finished (eos, stop tokens, stop strings, max_tokens, max_model_len), and builds
the RequestOutputs the caller sees."""

from __future__ import annotations

import time

from argosy.server.engine.sequence import Request, Sequence
from argosy.server.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from argosy.server.text.detokenizer import IncrementalDetokenizer
from argosy.server.text.tokenizer import Tokenizer
from argosy.server.worker.sampler import TokenLogprobs


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}

    def start(self, seq: Sequence) -> None:
        p = seq.params
        self._detokenizers[seq.seq_id] = IncrementalDetokenizer(
            self.tokenizer,
            seq.request.prompt_token_ids,
            p.skip_special_tokens,
            p.stop_strings,
            p.include_stop_str_in_output,
        )

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self._detokenizers[child.seq_id] = self._detokenizers[parent.seq_id].copy()

    def append(self, seq: Sequence, token_id: int, logprobs: TokenLogprobs | None) -> bool:
        """Adds a token; sets finish_reason/stop_reason and returns True if the sequence ends."""
        seq.token_ids.append(token_id)
        if logprobs is not None:
            seq.logprobs.append(self._logprob_entry(logprobs))
            seq.cumulative_logprob += logprobs.logprob
        p = seq.params
        may_stop = seq.num_output_tokens >= p.min_tokens
        stop_string = self._detokenizers[seq.seq_id].add(token_id, check_stop=may_stop)
        if may_stop and not p.ignore_eos and token_id in self.eos_token_ids:
            seq.finish_reason = "stop"
        elif may_stop and token_id in p.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token_id
        elif stop_string is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop_string
        elif (
            p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens
        ) or seq.num_tokens >= self.max_model_len:
            seq.finish_reason = "length"
        if seq.finish_reason is not None and stop_string is None:
            self._detokenizers[seq.seq_id].flush()
        return seq.finish_reason is not None

    def abort(self, seq: Sequence) -> None:
        seq.finish_reason = seq.finish_reason or "abort"

    def request_output(self, request: Request) -> RequestOutput:
        outputs = [self._completion(seq) for seq in sorted(request.seqs, key=lambda s: s.index)]
        finished = request.is_finished
        if finished:
            request.finished_time = request.finished_time or time.monotonic()
            self.release(request)
        metrics = RequestMetrics(
            request.arrival_time, request.first_scheduled_time, request.first_token_time, request.finished_time
        )
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            outputs,
            finished,
            request.num_cached_tokens,
            metrics,
        )

    def release(self, request: Request) -> None:
        for seq in request.seqs:
            self._detokenizers.pop(seq.seq_id, None)

    def _completion(self, seq: Sequence) -> CompletionOutput:
        detok = self._detokenizers.get(seq.seq_id)
        text = detok.output_text(seq.finish_reason is not None) if detok else ""
        wanted = seq.params.logprobs is not None
        return CompletionOutput(
            seq.index,
            text,
            seq.output_token_ids,
            seq.cumulative_logprob if wanted else None,
            list(seq.logprobs) if wanted else None,
            seq.finish_reason,
            seq.stop_reason,
        )

    def _logprob_entry(self, lp: TokenLogprobs) -> dict[int, Logprob]:
        text = self.tokenizer.token_text
        entry = {lp.token_id: Logprob(lp.logprob, lp.rank, text(lp.token_id))}
        for rank, (token_id, value) in enumerate(lp.top, start=1):
            entry.setdefault(token_id, Logprob(value, rank, text(token_id)))
        return entry
