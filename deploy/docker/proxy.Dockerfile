# The toposerve proxy (and loadgen) without vLLM: small image for deploy/compose.yaml, which runs
# vLLM from its official image. Build from the repository root:
#   docker build -f deploy/docker/proxy.Dockerfile -t toposerve-proxy .
FROM python:3.11-slim

WORKDIR /opt/toposerve
COPY pyproject.toml README.md ./
COPY launcher ./launcher
COPY server ./server
COPY loadgen ./loadgen
COPY topocommon ./topocommon
# Base dependencies only: the engine runs in its own container.
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home toposerve

USER toposerve
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["python", "-m", "server"]
CMD ["--upstream", "http://vllm:8001", "--host", "0.0.0.0", "--port", "8000"]
