"""A real LiteLLM proxy, run from examples/litellm/config.yaml, in front of two real `argosy
serve` processes, driven with the official `openai` client: requests and streams pass, a wrong
key is refused before reaching a backend, the rate limit of each deployment is enforced with
429, and both backends served (their own metrics say so).

The proxy lives in its own virtual environment (README: the test command makes it), as it
would in its own container: its pinned dependencies never meet the server's."""

from __future__ import annotations

import datetime
import os
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.polling import wait_until
from tests.processes import MODEL, free_port, running, serve_process

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LITELLM = ROOT / ".venv-gateway" / "bin" / "litellm"
CONFIG = ROOT / "examples" / "litellm" / "config.yaml"
MASTER_KEY, BACKEND_KEY = "sk-argosy-test-master", "backend-secret"
RPM = 3  # per deployment, scaled down from the example's so the test reaches it


def proxy_config() -> dict:
    """The example's configuration, with the test's model name and a lower rate limit."""
    config = yaml.safe_load(CONFIG.read_text())
    for deployment in config["model_list"]:
        params = deployment["litellm_params"]
        params["model"] = f"hosted_vllm/{MODEL}"
        params["rpm"] = RPM
    assert {d["litellm_params"]["api_base"] for d in config["model_list"]} == {
        "os.environ/ARGOSY_ZONE_A_URL",
        "os.environ/ARGOSY_ZONE_B_URL",
    }
    return config


@pytest.fixture(scope="module")
def gateway(llama_checkpoint, tmp_path_factory):
    assert LITELLM.exists(), "LiteLLM is not installed: the README's test command makes .venv-gateway"
    folder = tmp_path_factory.mktemp("litellm")
    with ExitStack() as stack:
        backends = [
            stack.enter_context(serve_process(llama_checkpoint, "--api-key", BACKEND_KEY)).url for _ in range(2)
        ]
        (folder / "config.yaml").write_text(yaml.safe_dump(proxy_config()))
        port = free_port()
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": MASTER_KEY,
            "ARGOSY_ZONE_A_URL": f"{backends[0]}/v1",
            "ARGOSY_ZONE_B_URL": f"{backends[1]}/v1",
            "ARGOSY_API_KEY": BACKEND_KEY,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download at start-up
            "NO_DOCS": "True",
        }
        command = [str(LITELLM), "--config", str(folder / "config.yaml"), "--host", "127.0.0.1", "--port", str(port)]
        proxy = stack.enter_context(
            running(command, f"http://127.0.0.1:{port}", "/health/readiness", "LiteLLM", env=env, cwd=folder, wait=180)
        )
        yield proxy.url, backends


def served(backend: str) -> float:
    """Requests the backend finished, from its own /metrics."""
    text = httpx.get(f"{backend}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("argosy_request_success_total{")
    )


def client(url: str, key: str = MASTER_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def test_a_wrong_key_is_refused_before_any_backend(gateway):
    url, backends = gateway
    before = [served(b) for b in backends]
    with pytest.raises((openai.AuthenticationError, openai.BadRequestError)) as refused:
        client(url, "sk-wrong").completions.create(model="llama3-8b-instruct", prompt="hello", max_tokens=4)
    # 401 with LiteLLM's database; without one, LiteLLM answers any key but the master key 400.
    assert refused.value.status_code == 401 or "no_db_connection" in str(refused.value.body)
    assert [served(b) for b in backends] == before


def test_requests_and_streams_pass_are_balanced_and_rate_limited(gateway):
    url, backends = gateway
    # LiteLLM counts each deployment's requests per clock minute: start where the whole
    # sequence fits into one minute, so that no count is reset halfway.
    wait_until(lambda: datetime.datetime.now(datetime.UTC).second < 40, 30, "the start of a minute")
    before = [served(b) for b in backends]
    api = client(url)
    completion = api.completions.create(model="llama3-8b-instruct", prompt="The capital of France is", max_tokens=8)
    assert completion.choices[0].text and completion.usage.completion_tokens > 0
    chunks = list(
        api.chat.completions.create(
            model="llama3-8b-instruct",
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12,
            stream=True,
        )
    )
    assert len(chunks) > 2 and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    passed = 2
    with pytest.raises(openai.RateLimitError) as limited:
        while passed <= 2 * RPM:  # at most both deployments' limits pass: then one is too many
            api.completions.create(model="llama3-8b-instruct", prompt="Hello", max_tokens=4)
            passed += 1
    assert limited.value.status_code == 429 and "No deployments available" in limited.value.message
    wait_until(lambda: sum(served(b) for b in backends) - sum(before) == passed, 10, "the backends' counts")
    counts = [served(b) - s for b, s in zip(backends, before)]
    print(f"\n{passed} requests passed before the 429; per backend: {counts}")
    # Both took traffic, neither more than its limit. (LiteLLM's usage-based routing stops
    # choosing a deployment one request short of its rpm: 2 of 3 each, seen here.)
    assert all(1 <= c <= RPM for c in counts) and passed >= 4
