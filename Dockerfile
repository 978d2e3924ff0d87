# laneway, CPU images: the gateway in front of upstream engines, and beside it its built-in engine.
#   docker build -t laneway .                            # full: the built-in engine on the CPU too
#   docker build --target gateway -t laneway:gateway .   # slim: no torch (upstream engines only)
# (both can send OpenTelemetry traces: --otlp-traces-endpoint URL)
#   docker run -p 8000:8000 -v $PWD/laneway.toml:/etc/laneway/laneway.toml:ro laneway
# For the in-process engine on NVIDIA GPUs, build FROM an image with CUDA and install the CUDA
# build of torch instead (docs/deploy.md).
FROM python:3.11-slim AS gateway

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/laneway
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install '.[otel]' && useradd --create-home --uid 10001 laneway && mkdir -p /var/lib/laneway /etc/laneway \
    && chown laneway /var/lib/laneway

USER laneway
EXPOSE 8000
# a non-loopback address needs API keys ([tenants.NAME] key_sha256) in the configuration
CMD ["laneway", "serve", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/laneway/laneway.toml", \
     "--data-dir", "/var/lib/laneway", "--log-format", "json"]

FROM gateway AS full
USER root
# the CPU build of torch first (PyPI's default build is the multi-GB CUDA one), then the engine's extra
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 && pip install '.[engine]'
USER laneway
