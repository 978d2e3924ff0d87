# laneway, CPU image: the gateway (and its built-in engine on the CPU) in front of upstream engines.
#   docker build -t laneway .
#   docker run -p 8000:8000 -v $PWD/laneway.toml:/etc/laneway/laneway.toml:ro laneway
# For the in-process engine on NVIDIA GPUs, build FROM an image with CUDA and install the CUDA
# build of torch instead (docs/deploy.md); with upstream workers only, this image is all it needs.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# the CPU build of torch first (PyPI's default build is the multi-GB CUDA one)
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /opt/laneway
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && useradd --create-home --uid 10001 laneway && mkdir -p /var/lib/laneway /etc/laneway \
    && chown laneway /var/lib/laneway

USER laneway
EXPOSE 8000
# a non-loopback address needs API keys ([tenants.NAME] key_sha256) in the configuration
CMD ["laneway", "serve", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/laneway/laneway.toml", \
     "--data-dir", "/var/lib/laneway", "--log-format", "json"]
