"""The InferenceService spec as typed models: the one source of the CRD's schema.

`python -P -m argosy.operator.crd` writes the CRD from these models, as controller-gen does from
Go types: each field's type, bounds, enum, default and description, and the CEL rules beside
the fields they constrain. Engine settings take the server's own defaults and flag names."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from argosy.flags import flag_name, settings_of
from argosy.operator.kube_types import (
    IntOrPercent,
    KubeModel,
    LocalObjectReference,
    ResourceRequirements,
    SecretKeyRef,
    Toleration,
    VolumeClaim,
    cel,
    rules,
)
from argosy.server.api.server_config import ServerConfig
from argosy.server.engine.block_hash import HashAlgo
from argosy.server.engine_config import (
    DEFAULT_BATCHED_TOKENS,
    AttentionBackendName,
    DType,
    EngineConfig,
    Quantization,
)
from argosy.server.scheduling.policy import SchedulingPolicy

DEFAULT_IMAGE = "ghcr.io/argosy-dev/argosy:0.1.0"
MODEL_MOUNT = "/models"
_SERVER = ServerConfig()


@dataclasses.dataclass(frozen=True)
class ServeFlag:
    """Marks a spec field that becomes this flag of `argosy serve`."""

    flag: str


def serve_flags(model: type[KubeModel]) -> dict[str, str]:
    """A spec section's fields that are flags of `argosy serve`, with the flag of each."""
    return {
        name: marker.flag
        for name, field in model.model_fields.items()
        for marker in field.metadata
        if isinstance(marker, ServeFlag)
    }


def engine_flags() -> dict[str, str]:
    return serve_flags(EngineSpec)


# Each setting of `argosy serve`: its dataclass field, and the default configuration holding it.
_SERVER_SETTINGS = {f.name: (f, _SERVER) for f in settings_of(ServerConfig)} | {
    f.name: (f, _SERVER.engine) for f in settings_of(EngineConfig)
}


def serve_setting(setting: str, *, description: str, convert=None, **constraints: Any) -> Any:
    """A field passed to `argosy serve` as the flag of the server setting `setting`, whose
    default is the server's."""
    field, config = _SERVER_SETTINGS[setting]
    default = getattr(config, setting)
    info = Field(
        convert(default) if convert and default is not None else default, description=description, **constraints
    )
    info.metadata.append(ServeFlag(flag_name(field)))
    return info


def model_name_field(description: str) -> Any:
    """A model name as the server takes them (a request's `model`), of at most 128 characters."""
    return Field(min_length=1, max_length=128, pattern="^[A-Za-z0-9][A-Za-z0-9._:/-]*$", description=description)


def relative_path_field(field_path: str, description: str, default: Any = ..., max_length: int = 512) -> Any:
    """A path inside a folder (a volume, a source): relative, never above its root."""
    return Field(
        default,
        min_length=1,
        max_length=max_length,
        json_schema_extra=rules(
            cel(
                "!self.startsWith('/') && !self.contains('..')",
                f"{field_path} must be a relative path and must not contain '..'",
            )
        ),
        description=description,
    )


class ModelSpec(KubeModel):
    """The checkpoint and where it lives."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "[has(self.hostPath), has(self.persistentVolumeClaim), has(self.cacheRef)].filter(x, x).size() == 1",
                "spec.model needs exactly one volume source, hostPath, persistentVolumeClaim or cacheRef",
            )
        )
    )

    name: str = model_name_field("Served model name, as clients pass it in the OpenAI `model` field.")
    path: str = relative_path_field(
        "spec.model.path",
        "Checkpoint folder (Hugging Face layout) relative to the volume root; mounted read-only and passed to "
        "`argosy serve --model /models/<path>`. Default: the volume root (a ModelCache's copy is one checkpoint).",
        ".",
    )
    hostPath: str | None = Field(
        None,
        pattern="^/",
        max_length=1024,
        description="Node-local folder (e.g. NVMe) holding checkpoints; mounted at /models.",
    )
    persistentVolumeClaim: VolumeClaim | None = None
    cacheRef: LocalObjectReference | None = Field(
        None,
        description=(
            "A ModelCache in this namespace: the pods run only on nodes holding a ready copy of it, mounted "
            "read-only at /models."
        ),
    )
    nodeSelector: dict[str, str] = Field(
        default_factory=dict, description="Labels of the nodes that hold this checkpoint."
    )


class SpeculativeSpec(KubeModel):
    """Speculative decoding (--speculative-config): drafts of the next tokens, verified in one step
    with nothing lost (greedy tokens and sampled distributions as without). Pays at low load."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "(self.method == 'draft_model') == has(self.model)",
                "spec.engine.speculativeConfig.model is needed with method draft_model, and only with it",
                ".model",
            ),
            cel(
                "!has(self.promptLookupMin) || !has(self.promptLookupMax) || "
                "self.promptLookupMin <= self.promptLookupMax",
                "spec.engine.speculativeConfig.promptLookupMin must not exceed promptLookupMax",
                ".promptLookupMin",
            ),
        )
    )

    method: Literal["ngram", "draft_model"] = Field(
        description="ngram: prompt lookup (the tokens after an earlier occurrence of the latest ones); "
        "draft_model: a smaller checkpoint of the same vocabulary."
    )
    numSpeculativeTokens: int = Field(ge=1, le=16, description="Tokens proposed, and verified, per step.")
    promptLookupMin: int | None = Field(None, ge=1, le=64, description="ngram: the shortest match; default 5.")
    promptLookupMax: int | None = Field(None, ge=1, le=64, description="ngram: the longest match, tried first.")
    model: str | None = relative_path_field(
        "spec.engine.speculativeConfig.model",
        "draft_model: the draft checkpoint's folder relative to the model volume's root.",
        default=None,
    )
    disableByBatchSize: int | None = Field(
        None, ge=1, description="No speculation while more sequences than this run; default 16."
    )

    def flag_value(self) -> str:
        """The JSON `argosy serve --speculative-config` takes, the draft's folder where it is mounted."""
        config = {
            "method": self.method,
            "num_speculative_tokens": self.numSpeculativeTokens,
            "prompt_lookup_min": self.promptLookupMin,
            "prompt_lookup_max": self.promptLookupMax,
            "model": None if self.model is None else f"{MODEL_MOUNT}/{self.model}",
            "disable_by_batch_size": self.disableByBatchSize,
        }
        return json.dumps({key: value for key, value in config.items() if value is not None})


KV_EVENTS_PORT = 5557


class KVEventsSpec(KubeModel):
    """The KV cache's block events (--kv-events-config), in vLLM's format on a ZMQ PUB socket of each pod,
    for cache-aware routers (the router spec.routing.router runs, llm-d's precise prefix-cache scorer)."""

    port: int = Field(KV_EVENTS_PORT, ge=1024, le=65535, description="The pods' port the events are published on.")
    connect: str | None = Field(
        None,
        max_length=512,
        pattern=r"^tcp://[A-Za-z0-9.-]+:[0-9]{1,5}$",
        description=(
            "Instead of binding port: connect to a subscriber that binds this tcp://HOST:PORT (llm-d's Endpoint "
            "Picker with its precise prefix-cache scorer)."
        ),
    )
    replayPort: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="A port that replays recent event batches to a subscriber that missed them.",
    )
    bufferSteps: int = Field(10_000, ge=1, le=1_000_000, description="Event batches kept for replay.")
    hwm: int = Field(100_000, ge=0, description="Messages a slow subscriber may lag before it loses some.")
    maxQueueSize: int = Field(
        100_000, ge=1, description="Batches waiting to be sent before new ones are dropped (never blocking a step)."
    )
    topic: str = Field(
        "",
        max_length=256,
        description=(
            "The topic of every message; routers subscribe to all. $(POD_IP) is the pod's address (llm-d's scorer "
            "reads the pod from a topic kv@$(POD_IP)@MODEL)."
        ),
    )

    def flag_value(self) -> str:
        """The JSON `argosy serve --kv-events-config` takes."""
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.connect or f"tcp://*:{self.port}",
            "replay_endpoint": None if self.replayPort is None else f"tcp://*:{self.replayPort}",
            "buffer_steps": self.bufferSteps,
            "hwm": self.hwm,
            "max_queue_size": self.maxQueueSize,
            "topic": self.topic,
        }
        return json.dumps({key: value for key, value in config.items() if value is not None})


KV_TRANSFER_PORT = 5600


class KVTransferSpec(KubeModel):
    """Prefill/decode disaggregation's KV connector (--kv-transfer-config): a prefill pod holds a
    prompt's blocks for a decode pod, which pulls them from its side channel (ZMQ over TCP)."""

    kvConnector: Literal["ZmqConnector", "NixlConnector"] = Field(
        "ZmqConnector",
        description="ZmqConnector: blocks over the side channel's TCP socket; NixlConnector: read with NIXL "
        "(UCX: RDMA, GPU memory), as vLLM's.",
    )
    kvRole: Literal["kv_both", "kv_producer", "kv_consumer"] = Field(
        "kv_both", description="As vLLM's: every role both holds and pulls here."
    )
    port: int = Field(KV_TRANSFER_PORT, ge=1024, le=65535, description="The pods' side-channel port.")
    holdTimeoutSeconds: float = Field(
        480, gt=0, le=86400, description="How long a prefill's blocks wait for their decode pod before they go back."
    )
    pullTimeoutSeconds: float = Field(
        30, gt=0, le=3600, description="How long a pull waits for the prefill pod before the prompt is computed here."
    )

    def flag_value(self) -> str:
        """The JSON `argosy serve --kv-transfer-config` takes; the pod's address from $(POD_IP)."""
        extra = {"side_channel_host": "$(POD_IP)", "side_channel_port": self.port,
                 "hold_timeout": self.holdTimeoutSeconds, "pull_timeout": self.pullTimeoutSeconds}  # fmt: skip
        config = {"kv_connector": self.kvConnector, "kv_role": self.kvRole, "kv_connector_extra_config": extra}
        return json.dumps(config)


class EngineSpec(KubeModel):
    """Settings of `argosy serve`; names and defaults are the server's (vLLM's names)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.maxModelLen) || !has(self.maxNumBatchedTokens) || self.enableChunkedPrefill"
                " || self.maxNumBatchedTokens >= self.maxModelLen",
                "spec.engine.maxNumBatchedTokens must be at least spec.engine.maxModelLen when "
                "spec.engine.enableChunkedPrefill is false",
                ".maxNumBatchedTokens",
            ),
            # double(): a whole number of GiB may arrive as an integer.
            cel(
                "self.prefixCachingHashAlgo != 'sha256_cbor' || has(self.hashSeed)",
                "spec.engine.hashSeed is needed with prefixCachingHashAlgo sha256_cbor: unseeded, each pod hashes "
                "blocks its own way and no router or scorer can match them",
                ".hashSeed",
            ),
            cel(
                "double(self.swapSpace) == 0.0 || !has(self.kvTransferConfig)",
                "spec.engine.swapSpace and spec.engine.kvTransferConfig each take the pod's one KV connector: give one",
                ".kvTransferConfig",
            ),
            cel(
                "double(self.swapSpace) == 0.0 || self.enablePrefixCaching",
                "spec.engine.swapSpace needs spec.engine.enablePrefixCaching: the host tier finds blocks by its hashes",
                ".swapSpace",
            ),
            cel(
                "double(self.swapSpace) == 0.0 || !has(self.speculativeConfig)"
                " || self.speculativeConfig.method != 'draft_model'",
                "spec.engine.swapSpace does not keep a draft model's KV cache: use ngram speculation or none",
                ".swapSpace",
            ),
            *(
                cel(
                    f"self.pipelineParallelSize == 1 || {absent}",
                    f"spec.engine.{name} is not served with spec.engine.pipelineParallelSize above 1 yet",
                    f".{name}",
                )
                for name, absent in (
                    ("speculativeConfig", "!has(self.speculativeConfig)"),
                    ("kvTransferConfig", "!has(self.kvTransferConfig)"),
                    ("swapSpace", "double(self.swapSpace) == 0.0"),
                )
            ),
        )
    )

    maxModelLen: int | None = serve_setting(
        "max_model_len",
        ge=16,
        description=(
            "Longest prompt plus output, in tokens (--max-model-len); default: the checkpoint's context length."
        ),
    )
    maxNumSeqs: int = serve_setting(
        "max_num_seqs", ge=1, le=4096, description="Most sequences in one step (--max-num-seqs)."
    )
    maxNumBatchedTokens: int | None = serve_setting(
        "max_num_batched_tokens",
        ge=16,
        description=(
            f"Most tokens in one step (--max-num-batched-tokens); default {DEFAULT_BATCHED_TOKENS}, and at least "
            "maxModelLen without chunked prefill."
        ),
    )
    blockSize: Literal[8, 16, 32, 64, 128] = serve_setting(
        "block_size", description=("Tokens per KV-cache block (--block-size).")
    )
    gpuMemoryUtilization: float = serve_setting(
        "gpu_memory_utilization",
        ge=0.05,
        le=1,
        description=("Fraction of GPU memory for weights, activations and KV cache (--gpu-memory-utilization)."),
    )
    kvCacheMemory: int | None = serve_setting(
        "kv_cache_memory",
        ge=1 << 20,
        description=("KV-cache size in bytes (--kv-cache-memory), for CPU nodes; GPUs use gpuMemoryUtilization."),
    )
    enablePrefixCaching: bool = serve_setting(
        "enable_prefix_caching",
        description=("Reuse the KV-cache blocks of identical prompt prefixes (--enable-prefix-caching)."),
    )
    enableChunkedPrefill: bool = serve_setting(
        "enable_chunked_prefill",
        description=("Split long prompts across steps, mixed with decodes (--enable-chunked-prefill)."),
    )
    dtype: DType = serve_setting(
        "dtype", description=("Weights and KV-cache dtype (--dtype); auto: the checkpoint's half type on GPU.")
    )
    attentionBackend: AttentionBackendName = serve_setting(
        "attention_backend",
        description=(
            "Kernels of attention, KV-cache writes, norms, rotary and activation (--attention-backend); auto: "
            "Triton on GPUs, PyTorch on CPU nodes."
        ),
    )
    enforceEager: bool = serve_setting(
        "enforce_eager", description="Run decode steps without CUDA graphs (--enforce-eager)."
    )
    cudaGraphSizes: list[Annotated[int, Field(ge=1, le=4096, description="A decode batch size.")]] = serve_setting(
        "cuda_graph_sizes",
        max_length=64,
        description=(
            "Decode batch sizes captured as CUDA graphs (--cuda-graph-sizes); default 1, 2, 4, 8, then steps of "
            "8 up to maxNumSeqs."
        ),
    )
    quantization: Quantization | None = serve_setting(
        "quantization",
        description=(
            "fp8: linear-layer weights in float8 e4m3 with per-channel scales, quantized at load (--quantization); "
            "FP8 matrix products on GPUs of compute capability 8.9 and up; int8: weight-only int8 with per-channel "
            "scales, for CPUs."
        ),
    )
    maxWaitingRequests: int = serve_setting(
        "max_waiting_requests",
        ge=1,
        description=("Queued requests beyond which new ones get 503 (--max-waiting-requests)."),
    )
    shutdownTimeoutSeconds: int = serve_setting(
        "shutdown_timeout",
        convert=int,
        ge=0,
        le=3600,
        description=(
            "Seconds requests in flight may take to finish when a pod stops (--shutdown-timeout); the pod's "
            "termination grace period is set above it."
        ),
    )
    engineStepTimeoutSeconds: int = serve_setting(
        "engine_step_timeout",
        convert=int,
        ge=5,
        le=3600,
        description=(
            "Longest the engine may go without finishing a step while it holds work, or without answering a "
            "ping while idle (--engine-step-timeout); past it the engine counts as hung, the requests in flight "
            "fail and the pod's server exits, so that the kubelet restarts it. Keep it above the longest step "
            "(argosy_engine_step_duration_seconds): a prefill of maxNumBatchedTokens on the slowest node."
        ),
    )
    tensorParallelSize: int = serve_setting(
        "tensor_parallel_size",
        ge=1,
        le=16,
        description=(
            "Ranks that split each layer's heads and MLP (--tensor-parallel-size), one GPU each, within the pod's "
            "node; set the pod's nvidia.com/gpu limit to the same number. A model larger than one node adds "
            "pipelineParallelSize."
        ),
    )
    pipelineParallelSize: int = serve_setting(
        "pipeline_parallel_size",
        ge=1,
        le=16,
        description=(
            "Stages the decoder layers are split into (--pipeline-parallel-size), each of tensorParallelSize "
            "ranks. With the pod's nvidia.com/gpu limit at tensorParallelSize (or no GPU), each pod holds one "
            "stage and every replica is a group of that many pods, made as a LeaderWorkerSet (its CRD installed): "
            "the leader serves the API, the workers run their stages, and a pod that fails restarts its group. "
            "With the limit at tensorParallelSize x pipelineParallelSize, one pod holds every stage."
        ),
    )
    schedulingPolicy: SchedulingPolicy = serve_setting(
        "scheduling_policy",
        description=(
            "Which waiting request runs next (--scheduling-policy): fcfs by arrival; priority by the request's "
            "`priority` (lower first, aged by waiting, may preempt); fair by the tokens each `user` was served."
        ),
    )
    swapSpace: float = serve_setting(
        "swap_space",
        ge=0,
        le=4096,
        description=(
            "GiB of host memory for a second KV tier (--swap-space): evicted and preempted blocks are kept there and "
            "loaded back instead of recomputed. The pod's memory request and limit grow by it."
        ),
    )
    speculativeConfig: SpeculativeSpec | None = serve_setting(
        "speculative_config", description="Speculative decoding (--speculative-config); default: none."
    )
    prefixCachingHashAlgo: HashAlgo = serve_setting(
        "prefix_caching_hash_algo",
        description=(
            "How full blocks are hashed (--prefix-caching-hash-algo): sha256, or vLLM's sha256_cbor, which llm-d's "
            "precise prefix-cache scorer computes from tokens itself (with hashSeed, the same in the scorer)."
        ),
    )
    hashSeed: str | None = Field(
        None,
        max_length=64,
        description="The seed of sha256_cbor block hashes (PYTHONHASHSEED in the pods), as the scorer's hashSeed.",
    )
    kvEventsConfig: KVEventsSpec | None = serve_setting(
        "kv_events_config",
        description=(
            "Publish the KV cache's block events (--kv-events-config); default: off, or on at port 5557 when "
            "spec.routing.router's policy is kv_aware."
        ),
    )
    kvTransferConfig: KVTransferSpec | None = serve_setting(
        "kv_transfer_config",
        description=(
            "Hand prompts' KV blocks between pods (--kv-transfer-config); default: off, or on for both roles of "
            "spec.disaggregation."
        ),
    )
    apiKeySecretRef: SecretKeyRef | None = Field(
        None, description=("Secret key holding the API key clients must send as a bearer token.")
    )


class LoRASpec(KubeModel):
    """The server's LoRA limits; LoRA is on with this or with spec.adapters."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.maxCpuLoras) || self.maxCpuLoras >= self.maxLoras",
                "spec.lora.maxCpuLoras must be at least spec.lora.maxLoras",
                ".maxCpuLoras",
            )
        )
    )

    maxLoras: int = serve_setting(
        "max_loras", ge=1, le=256, description="Device slots: the most distinct adapters in one step (--max-loras)."
    )
    maxLoraRank: int = serve_setting(
        "max_lora_rank", ge=1, le=512, description="The highest adapter rank served (--max-lora-rank)."
    )
    maxCpuLoras: int | None = serve_setting(
        "max_cpu_loras",
        ge=1,
        description=(
            "Adapters kept in host memory beyond those requests in flight use, least recently used evicted first "
            "(--max-cpu-loras); default maxLoras."
        ),
    )


class AdapterSpec(KubeModel):
    """A LoRA adapter served beside the base model, by its own model name."""

    name: str = model_name_field("The adapter's model name, as clients pass it in the OpenAI `model` field.")
    path: str = relative_path_field(
        "spec.adapters[].path",
        "PEFT adapter folder (adapter_config.json and adapter_model.safetensors) relative to the model volume's root.",
    )


# The Gateway API's name patterns: a DNS label, and a DNS subdomain.
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_NAME = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"


class EndpointPickerSpec(KubeModel):
    """The Endpoint Picker (EPP) Service in this namespace that picks a pod for each request,
    e.g. llm-d's router installed with its chart (its Service is `<release>-epp`)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the picker's Service.")
    port: int = Field(9002, ge=1, le=65535, description="The picker's ext-proc (gRPC) port.")
    failureMode: Literal["FailOpen", "FailClose"] = Field(
        "FailClose",
        description=(
            "What the Gateway does when the picker does not answer: FailClose refuses the request, FailOpen "
            "sends it to any pod of the pool."
        ),
    )


class GatewayRef(KubeModel):
    """The Gateway an HTTPRoute attaches to."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Gateway.")
    namespace: str | None = Field(
        None,
        max_length=63,
        pattern=f"^{_DNS_LABEL}$",
        description="Namespace of the Gateway; default: the InferenceService's.",
    )
    sectionName: str | None = Field(
        None, max_length=253, pattern=f"^{_DNS_NAME}$", description="The Gateway listener to attach to."
    )


class RouteSpec(KubeModel):
    """An HTTPRoute that sends the Gateway's requests for the model to the InferencePool."""

    gateway: GatewayRef
    hostnames: list[
        Annotated[
            str, Field(min_length=1, max_length=253, pattern=rf"^(\*\.)?{_DNS_NAME}$", description="A host name.")
        ]
    ] = Field(default_factory=list, max_length=16, description="Host names the route matches; default: any.")
    pathPrefix: str = Field(
        "/",
        max_length=1024,
        pattern=r"^/(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*$",
        json_schema_extra=rules(
            cel(
                "!self.contains('//') && !self.contains('/./') && !self.contains('/../') && !self.contains('%2f')"
                " && !self.contains('%2F') && !self.endsWith('/.') && !self.endsWith('/..')",
                "spec.routing.route.pathPrefix must be a normalized path: no '//', '/./', '/../' or encoded '/'",
            )
        ),
        description="Request paths the route matches.",
    )
    matchModelHeader: bool = Field(
        False,
        description=(
            "Match only requests whose X-Gateway-Model-Name header is spec.model.name (the Inference "
            "Extension's body-based router sets it from the request's model field), so that several models "
            "share one Gateway and path."
        ),
    )
    requestTimeoutSeconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="Longest a request may take through the Gateway (long generations and streams); 0: no limit.",
    )


ROUTER_POLICIES = ("kv_aware", "cache_aware", "power_of_two", "round_robin", "consistent_hash")
RouterPolicy = Literal["kv_aware", "cache_aware", "power_of_two", "round_robin", "consistent_hash"]


class RouterSpec(KubeModel):
    """A router the operator runs in front of the pods: the vLLM router (a Rust router, shipped in
    Argosy's image), as a Deployment and a Service `<name>-router` on port 8000, which finds the pods by
    their labels as they come and go, and, with kv_aware, subscribes to each pod's KV-cache events to
    send each request where its prefix is cached."""

    policy: RouterPolicy = Field(
        "kv_aware",
        description=(
            "kv_aware: where the pods' KV-cache events say the prompt's prefix is cached, weighed with load; "
            "cache_aware: an approximate prefix tree of what the router sent where; power_of_two: the less loaded "
            "of two; round_robin; consistent_hash: by session or user."
        ),
    )
    replicas: int = Field(1, ge=1, le=16, description="Router replicas (each keeps its own index).")
    image: str | None = Field(None, min_length=1, description="The router's image; default: spec.image.")
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(requests={"cpu": "500m", "memory": "512Mi"}),
        description="The router container's resources.",
    )


class RoutingSpec(KubeModel):
    """How requests reach the pods: an InferencePool (inference.networking.k8s.io/v1) whose Endpoint
    Picker routes each request by the pods' queue depth, KV-cache use and prefix affinity, read from
    their vllm:* metrics; or a router the operator runs."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.endpointPicker) != has(self.router)",
                "spec.routing needs exactly one of endpointPicker and router",
            ),
            cel(
                "!has(self.route) || has(self.endpointPicker)",
                "spec.routing.route sends a Gateway's traffic to the InferencePool: "
                "it needs spec.routing.endpointPicker",
                ".route",
            ),
        )
    )

    endpointPicker: EndpointPickerSpec | None = None
    router: RouterSpec | None = None
    route: RouteSpec | None = None


class ObjectivesSpec(KubeModel):
    """What each request should see, and the engine profile (`argosy profile`) that says what a replica can do."""

    timeToFirstTokenSeconds: float = Field(gt=0, le=3600, description="Time to the first token to keep.")
    interTokenLatencySeconds: float = Field(gt=0, le=60, description="Mean time between output tokens to keep.")
    percentile: float = Field(
        99, ge=50, lt=100, description="The share of requests, in percent, whose time to first token is kept."
    )
    promptTokens: int = Field(512, ge=1, description="The typical prompt length of the traffic, in tokens.")
    outputTokens: int = Field(128, ge=1, description="The typical output length of the traffic, in tokens.")
    profileConfigMap: str = Field(
        min_length=1,
        max_length=253,
        description="The ConfigMap in the service's namespace whose key profile.json holds the engine's profile "
        "on the pods' hardware (argosy profile --output profile.json, then kubectl create configmap NAME "
        "--from-file=profile.json); labelled app.kubernetes.io/managed-by=argosy-profile, its changes are watched.",
    )


class AutoscalingSpec(KubeModel):
    """When present, a KEDA ScaledObject scales the pods on the waiting-queue depth
    (argosy_num_requests_waiting) read from Prometheus; with routing, also on the requests the
    Endpoint Picker holds, which lets it scale from zero."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.minReplicas <= self.maxReplicas",
                "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
                ".minReplicas",
            )
        )
    )

    minReplicas: int = Field(
        1,
        ge=0,
        description=(
            "0 only with spec.routing: the pods' queue-depth signal vanishes with the pods, and only the "
            "Endpoint Picker's queue of held requests can wake the service again."
        ),
    )
    maxReplicas: int = Field(ge=1, le=1000, description="Most replicas KEDA may run.")
    targetWaitingRequests: float = Field(5, ge=0.1, description="Waiting requests per replica that KEDA aims for.")
    prometheusAddress: str = Field(pattern="^https?://", description="Prometheus that scrapes the server pods.")
    pollingIntervalSeconds: int = Field(15, ge=1, description="How often KEDA reads the queue depth.")
    scaleDownStabilizationSeconds: int = Field(
        300, ge=0, le=3600, description=("How long the queue must stay low before a replica is removed.")
    )
    objectives: ObjectivesSpec | None = Field(
        None,
        description=(
            "Latency objectives: the thresholds of the triggers are derived from them and the engine's profile "
            "(running and waiting requests and KV-cache usage per replica; status.autoscaling says them); "
            "targetWaitingRequests, when set, still wins."
        ),
    )


class RoleEngineSpec(KubeModel):
    """Engine settings one role of spec.disaggregation sets apart from spec.engine (the rest are spec.engine's)."""

    maxNumSeqs: int | None = Field(None, ge=1, le=4096, description="Sequences in a step on this role's pods.")
    maxNumBatchedTokens: int | None = Field(None, ge=1, description="Tokens in a step on this role's pods.")
    enableChunkedPrefill: bool | None = Field(None, description="Whether this role's prompts are split across steps.")
    gpuMemoryUtilization: float | None = Field(None, gt=0, le=1, description="GPU memory this role's server may use.")
    kvCacheMemory: int | None = Field(None, ge=1, description="KV-cache bytes on this role's CPU nodes.")


class RoleSpec(KubeModel):
    """One role's pods: a Deployment `<name>-<role>` of its own, labelled argosy.dev/role."""

    replicas: int = Field(1, ge=0, description="Replicas when this role's autoscaling is off.")
    resources: ResourceRequirements | None = Field(None, description="This role's container; default: spec.resources.")
    engine: RoleEngineSpec = Field(default_factory=RoleEngineSpec)
    autoscaling: AutoscalingSpec | None = Field(None, description="KEDA on this role's own waiting queue.")


ROLES = ("prefill", "decode")


class DisaggregationSpec(KubeModel):
    """Prefill/decode disaggregation: prompts are prefilled on the prefill pods and decoded on the decode
    pods, which pull the prompts' KV blocks from them; the router of spec.routing.router, in its P/D mode,
    sends each request's two legs. A long prompt then never stalls the streams being decoded."""

    # A profile times one engine serving both phases; a role's pods serve one, so objectives cannot yet be
    # turned into a role's thresholds (refused rather than scaled on thresholds that do not describe it).
    model_config = ConfigDict(
        json_schema_extra=rules(
            *(
                cel(
                    f"!has(self.{role}.autoscaling) || !has(self.{role}.autoscaling.objectives)",
                    f"spec.disaggregation.{role}.autoscaling.objectives is not supported yet: the engine's profile "
                    f"times pods that serve both phases, not {role} pods alone; set "
                    f"spec.disaggregation.{role}.autoscaling.targetWaitingRequests instead",
                    f".{role}.autoscaling.objectives",
                )
                for role in ROLES
            )
        )
    )

    prefill: RoleSpec = Field(default_factory=RoleSpec)
    decode: RoleSpec = Field(default_factory=RoleSpec)
    kvTransferConfig: KVTransferSpec = Field(default_factory=KVTransferSpec)


class DisruptionBudgetSpec(KubeModel):
    """The PodDisruptionBudget of the pods."""

    maxUnavailable: IntOrPercent = Field(1, description="Pods that voluntary disruptions (drains) may take at once.")


class RolloutSpec(KubeModel):
    """How a spec change replaces pods. The default needs no spare GPU: a pod is stopped
    before its successor starts. With spare capacity, maxSurge 1 and maxUnavailable 0 keep
    every replica serving during a rollout."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])",
                "spec.rollout.maxSurge and spec.rollout.maxUnavailable must not both be zero",
            )
        )
    )

    maxSurge: IntOrPercent = Field(0, description="Pods started above the desired count during a rollout.")
    maxUnavailable: IntOrPercent = Field(1, description="Pods that may be missing during a rollout.")


_TP = "(has(self.engine) && has(self.engine.tensorParallelSize) ? self.engine.tensorParallelSize : 1)"
_PP = "(has(self.engine) && has(self.engine.pipelineParallelSize) ? self.engine.pipelineParallelSize : 1)"


class InferenceServiceSpec(KubeModel):
    """What to serve and how."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.autoscaling) || self.autoscaling.minReplicas > 0 || "
                "(has(self.routing) && has(self.routing.endpointPicker))",
                "spec.autoscaling.minReplicas may be 0 only with spec.routing.endpointPicker: without the Endpoint "
                "Picker holding requests, nothing could scale the service up from zero",
                ".autoscaling.minReplicas",
            ),
            cel(
                "!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
                "spec.adapters names must be unique",
                ".adapters",
            ),
            cel(
                "!has(self.adapters) || self.adapters.all(a, a.name != self.model.name)",
                "spec.adapters names must differ from spec.model.name",
                ".adapters",
            ),
            cel(
                "!has(self.disaggregation) || (has(self.routing) && has(self.routing.router))",
                "spec.disaggregation needs spec.routing.router: the router sends each request's two legs",
                ".disaggregation",
            ),
            cel(
                "!has(self.disaggregation) || !has(self.autoscaling)",
                "spec.autoscaling scales one Deployment: with spec.disaggregation, autoscale each role in "
                "spec.disaggregation.prefill.autoscaling and spec.disaggregation.decode.autoscaling",
                ".autoscaling",
            ),
            cel(
                f"!has(self.disaggregation) || {_TP} == 1",
                "spec.disaggregation hands blocks between single-rank pods: spec.engine.tensorParallelSize must be 1",
                ".disaggregation",
            ),
            cel(
                f"!has(self.resources) || !has(self.resources.limits) || !('nvidia.com/gpu' in self.resources.limits)"
                f" || int(string(self.resources.limits['nvidia.com/gpu'])) in [{_TP}, {_TP} * {_PP}]",
                "spec.resources.limits['nvidia.com/gpu'] must equal spec.engine.tensorParallelSize (one pipeline stage "
                "a pod) or tensorParallelSize x pipelineParallelSize (every stage in one pod): each rank takes one GPU "
                "of the pod's node",
                ".resources",
            ),
            cel(
                f"{_PP} == 1 || (!has(self.lora) && (!has(self.adapters) || size(self.adapters) == 0))",
                "spec.lora and spec.adapters are not served with spec.engine.pipelineParallelSize above 1 yet",
                ".engine.pipelineParallelSize",
            ),
            cel(
                f"!has(self.disaggregation) || {_PP} == 1",
                "spec.disaggregation hands blocks between single-rank pods: spec.engine.pipelineParallelSize must be 1",
                ".disaggregation",
            ),
        )
    )

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    image: str = Field(DEFAULT_IMAGE, min_length=1, description="The Argosy image running `argosy serve`.")
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    imagePullSecrets: list[LocalObjectReference] = Field(
        default_factory=list, description=("Secrets with the credentials of the image's registry.")
    )
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    replicas: int = Field(1, ge=0, description="Replicas when autoscaling is off (also set by `kubectl scale`).")
    autoscaling: AutoscalingSpec | None = None
    routing: RoutingSpec | None = None
    disaggregation: DisaggregationSpec | None = None
    lora: LoRASpec | None = None

    def role(self, role: str) -> InferenceServiceSpec:
        """The spec of one role's pods under spec.disaggregation: its replicas, resources, engine settings and
        autoscaling over the service's, with the KV connector on."""
        part: RoleSpec = getattr(self.disaggregation, role)
        overrides = part.engine.model_dump(exclude_none=True)
        engine = self.engine.model_copy(update={**overrides, "kvTransferConfig": self.disaggregation.kvTransferConfig})
        return self.model_copy(
            update={
                "replicas": part.replicas,
                "resources": part.resources or self.resources,
                "engine": engine,
                "autoscaling": part.autoscaling,
                "disaggregation": None,
            }
        )

    @property
    def kv_events(self) -> KVEventsSpec | None:
        """The pods' KV events: as set, or on with defaults for a kv_aware router."""
        router = self.routing and self.routing.router
        if self.engine.kvEventsConfig is None and router is not None and router.policy == "kv_aware":
            return KVEventsSpec()
        return self.engine.kvEventsConfig

    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "LoRA adapters served beside the base model, read from the model volume. They are written to a "
            "ConfigMap the pods watch: changing them loads and unloads adapters in the running servers, with no "
            "rollout."
        ),
    )
    nodeSelector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels, merged with spec.model.nodeSelector."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the pods tolerate.")
    affinity: dict[str, Any] | None = Field(None, description="A core/v1 Affinity, passed to the pods unchanged.")
    startupTimeoutSeconds: int = Field(
        1800, ge=30, le=86400, description=("How long a pod may take to load its model before it is restarted.")
    )
    shmSize: str = Field("1Gi", pattern="^[0-9]+(Ki|Mi|Gi)?$", description="Size of the in-memory /dev/shm.")
    disruptionBudget: DisruptionBudgetSpec = Field(default_factory=DisruptionBudgetSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    podAnnotations: dict[str, str] = Field(default_factory=dict, description="Added to the pods' annotations.")
    serviceAccountName: str | None = Field(None, description="The pods' ServiceAccount.")
    priorityClassName: str | None = Field(None, description="The pods' PriorityClass.")
