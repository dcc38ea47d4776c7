"""The flags and endpoints users of vLLM reach for, with vLLM's names, bodies and semantics:
/tokenize, /detokenize, /version, --max-logprobs, --tokenizer, --chat-template, TLS, a root path
behind a proxy, CORS and request logs."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import httpx
import pytest

import argosy
from tests.processes import MODEL
from tests.server.api.servers import run_server

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_tokenize_a_prompt_and_a_conversation_and_detokenize_back(server):
    tokenizer = server.engine.tokenizer
    out = httpx.post(
        f"{server.url}/tokenize", json={"model": MODEL, "prompt": "hello world", "return_token_strs": True}
    )
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["tokens"] == tokenizer.encode("hello world") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == server.engine.max_model_len
    assert body["token_strs"] == [tokenizer.token_text(t) for t in body["tokens"]]
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT["messages"]}).json()
    assert chat["tokens"] == tokenizer.encode(tokenizer.apply_chat_template(CHAT["messages"]), False)
    assert chat["token_strs"] is None
    back = httpx.post(f"{server.url}/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert back.json() == {"prompt": "hello world"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/tokenize", {"prompt": "x", "messages": CHAT["messages"]}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ],
)
def test_bad_tokenizer_requests(server, path, body, status, param):
    response = httpx.post(f"{server.url}{path}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_version(server):
    assert httpx.get(f"{server.url}/version").json() == {"version": argosy.__version__}


def test_max_logprobs_bounds_what_a_request_may_ask(llama_checkpoint):
    with run_server(llama_checkpoint, max_logprobs=3) as srv:
        fine = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "logprobs": 3})
        assert fine.status_code == 200 and len(fine.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 3
        over = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "logprobs": 4})
        assert over.status_code == 400 and over.json()["error"]["param"] == "logprobs"
        chat = httpx.post(f"{srv.url}/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 4})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"
    with run_server(llama_checkpoint, max_logprobs=30) as srv:
        many = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "logprobs": 25})
        assert many.status_code == 200 and len(many.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 25


def test_a_tokenizer_from_another_folder_and_a_chat_template_of_ones_own(llama_checkpoint, tmp_path):
    model = tmp_path / "weights-only"
    shutil.copytree(llama_checkpoint, model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    with run_server(model, tokenizer=str(llama_checkpoint), chat_template=str(template)) as srv:
        tokens = httpx.post(f"{srv.url}/tokenize", json={"messages": CHAT["messages"]}).json()["tokens"]
        assert srv.engine.tokenizer.decode(tokens) == "user: hi\nassistant:"
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_tls(llama_checkpoint, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    self_signed = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x"]
    subject = ["-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([*self_signed, *subject, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with run_server(llama_checkpoint, ssl_keyfile=str(key), ssl_certfile=str(cert)) as srv:
        assert srv.url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        out = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, verify=trusted)
        assert out.status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url.replace("https", "http") + "/health")


def test_a_root_path_names_the_prefix_a_proxy_strips(llama_checkpoint):
    with run_server(llama_checkpoint, root_path="/llm", api_key="k") as srv:
        assert httpx.get(f"{srv.url}/openapi.json").json()["servers"] == [{"url": "/llm"}]
        assert httpx.get(f"{srv.url}/v1/models").status_code == 401  # the key still guards the API
        models = httpx.get(f"{srv.url}/v1/models", headers={"Authorization": "Bearer k"})
        assert models.status_code == 200
        assert httpx.post(f"{srv.url}/tokenize", json={"prompt": "x"}).status_code == 401


def test_cors_answers_allowed_origins_only(llama_checkpoint):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    with run_server(llama_checkpoint, api_key="k") as srv:  # no origin by default (vLLM allows any)
        refused = httpx.options(f"{srv.url}/v1/completions", headers={"Origin": "http://a.example", **preflight})
        assert "access-control-allow-origin" not in refused.headers
        simple = httpx.get(f"{srv.url}/health", headers={"Origin": "http://a.example"})
        assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers
    with run_server(llama_checkpoint, api_key="k", allowed_origins=["*"]) as srv:
        allowed = httpx.options(f"{srv.url}/v1/completions", headers={"Origin": "http://a.example", **preflight})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "*"
    with run_server(llama_checkpoint, allowed_origins=['["http://a.example"]']) as srv:
        allowed = httpx.options(f"{srv.url}/v1/completions", headers={"Origin": "http://a.example", **preflight})
        assert allowed.headers["access-control-allow-origin"] == "http://a.example"
        other = httpx.options(f"{srv.url}/v1/completions", headers={"Origin": "http://b.example", **preflight})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        simple = httpx.post(
            f"{srv.url}/v1/completions", json=CHAT | {"prompt": "x"}, headers={"Origin": "http://a.example"}
        )
        assert simple.headers["access-control-allow-origin"] == "http://a.example"


def test_enable_log_requests_logs_each_prompt_cut_to_max_log_len(llama_checkpoint, caplog):
    logged = caplog.at_level("INFO", logger="argosy.requests")
    with run_server(llama_checkpoint, enable_log_requests=True, max_log_len=5) as srv, logged:
        body = {"model": MODEL, "prompt": "a long prompt to log", "max_tokens": 2, "seed": 7}
        assert httpx.post(f"{srv.url}/v1/completions", json=body).status_code == 200
    (record,) = [r for r in caplog.records if r.name == "argosy.requests"]
    assert record.fields["prompt"] == "a lon" and len(record.fields["prompt_token_ids"]) <= 5
    assert record.fields["params"]["seed"] == 7 and record.fields["params"]["max_tokens"] == 2
