"""Adapters on a real server, through the openai client and plain HTTP: a request picks its
adapter by `model`; adapters load and unload while serving, and requests in flight finish on
the weights they started with; a reload under the same name never reads the old adapter's
blocks; more adapters than slots all finish, none mixed; the bad-input table; the watched
adapters file; and the metrics a LoRA-aware router reads."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from argosy import LLM, LoRARequest, SamplingParams
from tests.adapters import make_adapter
from tests.polling import wait_until
from tests.processes import MODEL
from tests.server.api.servers import paused_core, run_server, stream_in_background

PROMPT = "once upon a time"  # stream_in_background's
LONG = 400  # tokens of a stream still running when the test acts (150 once ended first, on a loaded machine)


@pytest.fixture(scope="module")
def folders(llama_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(llama_checkpoint, root / f"a{i}", seed=i, rank=4) for i in range(4)]


@pytest.fixture(scope="module")
def offline(llama_checkpoint):
    """The offline engine with LoRA on: the tokens each adapter gives (it is held to PEFT's
    merged weights in the engine's tests)."""
    return LLM(str(llama_checkpoint), dtype="float32", enable_lora=True, max_lora_rank=16)


def expected(offline, folder, max_tokens: int = 12, prompt: str = PROMPT) -> str:
    lora = None if folder is None else LoRARequest(folder.name, 1, str(folder))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return offline.generate(prompt, params, lora_request=lora)[0].outputs[0].text


def complete(url: str, model: str, max_tokens: int = 12, prompt: str = PROMPT) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def text_of(events: list[str]) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and json.loads(e)["choices"])


def load(url: str, name: str, path, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra})


def unload(url: str, name: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})


@pytest.fixture(scope="module")
def server(llama_checkpoint, folders):
    with run_server(
        llama_checkpoint,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        allow_runtime_lora_updating=True,
        lora_modules=[f"a0={folders[0]}", json.dumps({"name": "a1", "path": str(folders[1])})],
    ) as running:
        yield running


def test_a_request_picks_its_adapter_by_model_and_models_lists_them(server, offline, folders):
    client = server.client()
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {MODEL, "a0", "a1"}
    assert (cards["a0"].parent, cards["a0"].root) == (MODEL, str(folders[0]))
    for model, folder in ((MODEL, None), ("a0", folders[0]), ("a1", folders[1])):
        out = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert (out.model, out.choices[0].text) == (model, expected(offline, folder))
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model="a1", messages=messages, max_tokens=12, temperature=0)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    lora = LoRARequest("a1", 1, str(folders[1]))
    assert (chat.model, chat.choices[0].message.content) == (
        "a1",
        offline.chat(messages, params, lora_request=lora)[0].outputs[0].text,
    )
    missing = complete(server.url, "nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_unload_while_streaming_finishes_the_stream_on_its_adapter(server, offline, folders):
    url = server.url
    assert load(url, "a2", folders[2]).status_code == 200
    results, started = [], threading.Event()
    stream = stream_in_background(url, LONG, results, started, model="a2", temperature=0)
    assert started.wait(60)
    with paused_core(server):  # the stream is certainly in flight, whatever this machine's speed
        answer = unload(url, "a2")
        assert answer.status_code == 200 and "removed" in answer.text
        assert complete(url, "a2").status_code == 404  # at once, for new requests
        assert stream.is_alive()
    stream.join(120)
    assert text_of(results[0]) == expected(offline, folders[2], LONG)
    assert "a2" not in {m.id for m in server.client().models.list().data}


def test_load_inplace_while_streaming_old_requests_old_weights_new_requests_new(server, offline, folders):
    url = server.url
    assert load(url, "swap", folders[2]).status_code == 200
    cached_prompt = "the same prompt twice, under one name " * 3
    assert complete(url, "swap", 4, cached_prompt).status_code == 200
    results, started = [], threading.Event()
    stream = stream_in_background(url, LONG, results, started, model="swap", temperature=0)
    assert started.wait(60)
    with paused_core(server):
        assert load(url, "swap", folders[3]).status_code == 409  # without load_inplace
        assert load(url, "swap", folders[3], load_inplace=True).status_code == 200
        assert stream.is_alive()
    after = complete(url, "swap", 12, cached_prompt).json()
    assert after["choices"][0]["text"] == expected(offline, folders[3], 12, cached_prompt)
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # never the old adapter's blocks
    again = complete(url, "swap", 12, cached_prompt).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the new one's are shared
    stream.join(120)
    assert text_of(results[0]) == expected(offline, folders[2], LONG)
    assert unload(url, "swap").status_code == 200


def test_more_adapters_than_slots_at_once_all_finish_none_mixed(server, offline, folders):
    url = server.url
    for i in (2, 3):
        assert load(url, f"b{i}", folders[i]).status_code == 200
    names = ["a0", "a1", "b2", "b3"]
    answers: dict[str, str] = {}

    def ask(name: str) -> None:
        answers[name] = complete(url, name, 24).json()["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == {n: expected(offline, f, 24) for n, f in zip(names, folders)}
    for i in (2, 3):
        assert unload(url, f"b{i}").status_code == 200


def test_aborted_and_parallel_requests_give_their_slots_back(server, offline, folders):
    url = server.url
    for i in (2, 3):
        assert load(url, f"c{i}", folders[i]).status_code == 200
    for name in ("a0", "a1"):  # both slots taken by n = 2 streams, left midway
        body = {"model": name, "prompt": PROMPT, "max_tokens": 300, "n": 2, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as stream:
            next(stream.iter_lines())
    # Were a slot still held, the request for the second of two new adapters could never run.
    answers = {}
    threads = [threading.Thread(target=lambda n=n: answers.update({n: complete(url, n, 8)})) for n in ("c2", "c3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {n: a.json()["choices"][0]["text"] for n, a in answers.items()} == {
        "c2": expected(offline, folders[2], 8),
        "c3": expected(offline, folders[3], 8),
    }
    info = [line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith("vllm:lora_requests")]
    assert 'running_lora_adapters=""' in info[0] and 'waiting_lora_adapters=""' in info[0]
    for i in (2, 3):
        assert unload(url, f"c{i}").status_code == 200


def test_bad_requests_name_the_field_or_file(server, folders, tmp_path):
    url = server.url
    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    (bin_only / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "peft_type": "LORA"}))
    (bin_only / "adapter_model.bin").write_bytes(b"pickle")
    cases = [
        (load(url, "x", tmp_path / "missing"), 400, "adapter folder not found"),
        (load(url, "x", bin_only), 400, "pickled .bin adapters are not supported"),
        (load(url, MODEL, folders[2]), 400, "the base model's name"),
        (load(url, "bad name!", folders[2]), 400, "not a valid model name"),
        (load(url, "a0", folders[2]), 409, "already loaded"),
        (unload(url, "never"), 404, "'never' is not loaded"),
        (httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x"}), 400, "lora_path"),
        (httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": 3, "lora_path": "p"}), 400, "lora_name"),
    ]
    for answer, status, words in cases:
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"]["message"], answer.text
    assert {m.id for m in server.client().models.list().data} == {MODEL, "a0", "a1"}  # nothing changed


def test_the_metrics_show_loaded_adapters_idle_or_not(server):
    url = server.url
    assert complete(url, "a0").status_code == 200
    loaded = {t: server.metric("argosy_lora_adapters_loaded", adapter="a0", tier=t) for t in ("device", "host")}
    assert loaded == {"device": 1.0, "host": 0.0}  # idle now, still in its slot
    families = httpx.get(f"{url}/metrics").text
    info = [line for line in families.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert len(info) == 1 and 'max_lora="2"' in info[0] and 'running_lora_adapters=""' in info[0]


def test_runtime_loading_is_off_unless_allowed(llama_checkpoint, folders):
    with run_server(llama_checkpoint, enable_lora=True) as plain:
        answer = load(plain.url, "x", folders[0])
        assert answer.status_code == 404 and "--allow-runtime-lora-updating" in answer.json()["error"]["message"]


def test_the_watched_file_loads_unloads_and_reloads_and_a_bad_entry_stops_nothing(
    llama_checkpoint, folders, offline, tmp_path
):
    listing = tmp_path / "adapters.json"
    listing.write_text(json.dumps([{"name": "w0", "path": str(folders[0])}]))
    with run_server(llama_checkpoint, enable_lora=True, lora_config_file=str(listing)) as watched:
        url = watched.url

        def served() -> set[str]:
            return {m.id for m in watched.client().models.list().data} - {MODEL}

        wait_until(lambda: served() == {"w0"}, 30, "w0 to be served")
        entries = [
            {"name": "w1", "path": str(folders[1])},
            {"name": "broken", "path": str(tmp_path / "nowhere")},
            {"name": "w2", "path": str(folders[2])},
        ]
        listing.write_text(json.dumps({"adapters": entries}))
        wait_until(lambda: served() == {"w1", "w2"}, 30, "w1 and w2 to replace w0")
        assert complete(url, "w0").status_code == 404
        assert watched.metric("argosy_lora_config_file_errors_total") == 1
        entries[0]["path"] = str(folders[3])  # w1 now stands for other weights
        listing.write_text(json.dumps(entries))
        wait_until(lambda: complete(url, "w1").json()["choices"][0]["text"] == expected(offline, folders[3]), 30, "w1")
        assert complete(url, "w2").json()["choices"][0]["text"] == expected(offline, folders[2])
