"""Constrained generation in the offline engine on a random tiny model, sampling at temperature
1: whatever the model prefers, every output satisfies its constraint, through parallel
sampling, preemption, prefix hits, chunked prefill, the graph path's twin, stop strings and
logprobs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest

from argosy import SamplingParams
from argosy.server.engine.llm_engine import LLMEngine
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError, TooManyRequestsError
from argosy.server.sampling_params import RequestOutputKind
from argosy.server.structured.grammar_compiler import PER_CLIENT_PENDING, PER_CLIENT_RUNNING
from argosy.server.structured.params import StructuredOutputsParams
from tests.checkpoints import tiny_llm
from tests.processes import alive
from tests.server.structured.schema_corpus import SCHEMAS, SLOW_SCHEMA

PROMPT = "Answer in JSON:"
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def constrained(max_tokens: int = 400, **kwargs) -> SamplingParams:
    constraint = {k: kwargs.pop(k) for k in list(kwargs) if k in ("json", "regex", "choice", "grammar", "json_object")}
    return SamplingParams(
        temperature=1.0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**constraint), **kwargs
    )


@pytest.fixture(scope="module")
def llm(llama_checkpoint):
    return tiny_llm(llama_checkpoint, structured_outputs_max_whitespace=2, kv_cache_memory=16 << 20)


def test_the_corpus_has_fifty_schemas_and_each_is_valid():
    assert len(SCHEMAS) >= 50
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_output_of_every_schema_validates(llm):
    params = [constrained(json=schema, seed=i, n=2) for i, schema in enumerate(SCHEMAS)]
    outputs = llm.generate([PROMPT] * len(SCHEMAS), params)
    for schema, out in zip(SCHEMAS, outputs):
        for choice in out.outputs:
            assert choice.finish_reason == "stop", (schema, choice.text)
            jsonschema.validate(
                json.loads(choice.text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
            )


def test_regex_choice_grammar_and_any_json_object(llm):
    regex = r"[A-Z][a-z]{2,5}-[0-9]{1,3}"
    out = llm.generate([PROMPT] * 8, [constrained(regex=regex, seed=i) for i in range(8)])
    assert all(re.fullmatch(regex, o.outputs[0].text) for o in out), [o.outputs[0].text for o in out]
    choices = ["alpha", "beta", "gamma delta"]
    out = llm.generate([PROMPT] * 8, [constrained(choice=choices, seed=i) for i in range(8)])
    assert {o.outputs[0].text for o in out} <= set(choices)
    grammar = 'root ::= "(" digit ("+" digit)* ")"\ndigit ::= [0-9]'
    out = llm.generate([PROMPT] * 4, [constrained(grammar=grammar, seed=i, max_tokens=60) for i in range(4)])
    for o in out:
        if o.outputs[0].finish_reason == "stop":
            assert re.fullmatch(r"\([0-9](\+[0-9])*\)", o.outputs[0].text)
    out = llm.generate([PROMPT] * 4, [constrained(json_object=True, seed=i, max_tokens=120) for i in range(4)])
    for o in out:
        if o.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(o.outputs[0].text), dict)


def test_a_completed_grammar_ends_the_output_with_stop_even_when_eos_is_ignored(llm):
    out = llm.generate(PROMPT, constrained(choice=["yes", "no"], ignore_eos=True, max_tokens=50))[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_parallel_samples_preemption_and_prefix_hits_keep_outputs_valid(llama_checkpoint):
    # A cache of a few blocks: the sequences preempt one another and are recomputed.
    llm = tiny_llm(llama_checkpoint, kv_cache_memory=40 * 8192, structured_outputs_max_whitespace=2)
    schema = SCHEMAS[8]  # people: an array of objects
    prompt = "A long shared prefix, so that the prompt spans whole blocks of the cache: " * 2
    params = [constrained(json=schema, seed=i, n=3) for i in range(6)]
    outputs = llm.generate([prompt] * 6, params)
    stats = llm.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    for out in outputs:
        assert len(out.outputs) == 3
        for choice in out.outputs:
            jsonschema.validate(json.loads(choice.text), schema)


def test_chunked_prefill_graph_twin_stop_strings_and_logprobs(llama_checkpoint):
    llm = tiny_llm(
        llama_checkpoint, max_num_batched_tokens=32, cuda_graph_sizes=[1, 2, 4, 8], structured_outputs_max_whitespace=2
    )
    schema = SCHEMAS[0]
    long_prompt = "word " * 20  # some 80 tokens, prefilled in chunks of 32
    outputs = llm.generate([long_prompt] * 4, [constrained(300, json=schema, seed=i, logprobs=2) for i in range(4)])
    for out in outputs:
        choice = out.outputs[0]
        jsonschema.validate(json.loads(choice.text), schema)
        assert len(choice.logprobs) == len(choice.token_ids)
    # A stop string ends the output where it appears, constrained or not.
    out = llm.generate(PROMPT, constrained(json=schema, stop=['"age"'], seed=3))[0].outputs[0]
    assert '"age"' not in out.text and out.finish_reason == "stop" and out.text.startswith("{")


def test_constraints_refuse_min_tokens_and_a_second_kind():
    for min_tokens, constraint in ((3, {"regex": "a"}), (1, {"regex": "a*"}), (2, {"json_object": True})):
        with pytest.raises(InvalidRequestError) as refused:
            SamplingParams(min_tokens=min_tokens, structured_outputs=StructuredOutputsParams(**constraint))
        assert refused.value.param == "min_tokens"
    # JSON is never empty: min_tokens 1 (as the vLLM router's prefill legs ask) changes nothing.
    SamplingParams(min_tokens=1, structured_outputs=StructuredOutputsParams(json_object=True)).validate()
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])


def test_a_slow_grammar_holds_back_no_other_request(llama_checkpoint):
    engine = LLMEngine(EngineConfig(model=str(llama_checkpoint), dtype="float32", kv_cache_memory=4 << 20))
    engine.add_request("slow", PROMPT, constrained(json=SLOW_SCHEMA))
    delta = RequestOutputKind.DELTA
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=8, ignore_eos=True, output_kind=delta))
    slow_compile = engine.core.grammars.compiler.jobs[StructuredOutputsParams(json=SLOW_SCHEMA).key]
    tokens_while_compiling = 0
    while "plain" in engine.requests:
        outputs = engine.step()
        if slow_compile.result is None:
            tokens_while_compiling += sum(len(o.outputs[0].token_ids) for o in outputs if o.request_id == "plain")
    assert slow_compile.result is None, "the slow grammar compiled before the other request ended: make it slower"
    assert tokens_while_compiling == 8
    engine.abort("slow")


def test_one_clients_heavy_grammars_hold_back_no_other_clients_and_stop_when_their_requests_go(llama_checkpoint):
    engine = LLMEngine(EngineConfig(model=str(llama_checkpoint), dtype="float32", kv_cache_memory=4 << 20))
    grammars = engine.core.grammars.compiler
    heavy = [{**SLOW_SCHEMA, "title": f"heavy {i}"} for i in range(PER_CLIENT_PENDING)]
    for i, schema in enumerate(heavy):
        engine.add_request(f"heavy-{i}", PROMPT, constrained(json=schema), user="attacker")
    with pytest.raises(TooManyRequestsError) as refused:  # its share queued: the next is a 429
        engine.add_request("one-more", PROMPT, constrained(json={**SLOW_SCHEMA, "title": "more"}), user="attacker")
    assert refused.value.status == 429 and refused.value.param == "structured_outputs"
    engine.add_request("light", PROMPT, constrained(max_tokens=4, regex="[ab]{4}"), user="victim")
    while "light" in engine.requests:
        engine.step()
    jobs = [grammars.jobs[StructuredOutputsParams(json=schema).key] for schema in heavy]
    assert all(job.result is None for job in jobs), "a heavy grammar compiled first: make them heavier"
    running = [job.process.pid for job in jobs if job.process is not None]
    assert len(running) == PER_CLIENT_RUNNING  # the attacker's share; the rest wait their turn
    for i in range(len(heavy)):
        engine.abort(f"heavy-{i}")
    assert grammars.jobs == {} and not any(alive(pid) for pid in running)  # stopped, not left to burn the CPU


def test_a_grammar_past_its_time_limit_fails_its_request_alone(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, structured_outputs_compile_timeout=0.2)
    slow = StructuredOutputsParams(json={**SLOW_SCHEMA, "title": "another"}, field="response_format")
    with pytest.raises(InvalidRequestError, match="did not compile within the time limit") as refused:
        llm.generate(PROMPT, SamplingParams(max_tokens=5, structured_outputs=slow))
    assert refused.value.param == "response_format"
    assert llm.generate(PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].finish_reason == "length"


def test_the_engine_serves_without_the_grammar_library_and_says_what_needs_it(llama_checkpoint):
    """The GPU machine has no xgrammar: everything but constraints must work there."""
    script = (
        "import sys\n"
        "sys.modules['xgrammar'] = None  # as if it were not installed\n"
        "from argosy import LLM, SamplingParams, StructuredOutputsParams\n"
        "from argosy.server.exceptions import InvalidRequestError\n"
        f"llm = LLM({str(llama_checkpoint)!r}, dtype='float32', kv_cache_memory=4 << 20)\n"
        "out = llm.generate('hi', SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0]\n"
        "assert len(out.token_ids) == 3\n"
        "try:\n"
        "    llm.generate('hi', SamplingParams(structured_outputs=StructuredOutputsParams(regex='a+')))\n"
        "except InvalidRequestError as exc:\n"
        "    assert 'pip install xgrammar' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('a constraint was served without its library')\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
