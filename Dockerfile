# trio-direct, the OpenAI-compatible frontend, as a container image (see docs/kubernetes.md).
#
#   docker build -t trio-direct .
#   docker run -p 8000:8000 -v /models:/models trio-direct \
#       --engine-dns sglang.llm.svc.cluster.local:30001 --model-path /models/qwen3-8b
#
# The frontend tokenizes itself: mount the model's tokenizer files (tokenizer.json and its configs;
# the weights are not needed) and point --model-path at them. Kubernetes probes /live and /health,
# so the image declares no HEALTHCHECK.
FROM python:3.13-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /home/trio-direct --create-home trio-direct

USER 10001
EXPOSE 8000

# SIGTERM drains: /health turns 503, in-flight requests get --graceful-shutdown-timeout to finish.
STOPSIGNAL SIGTERM
ENTRYPOINT ["trio-direct", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--engine-dns", "sglang.llm.svc.cluster.local:30001"]
