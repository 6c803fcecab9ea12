# One image for every harvest-celery process in docker-compose.yml: migrations, decision and
# activity workers, the HTTP API and Flower.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY . .
RUN pip install ".[api,flower]" \
    && useradd --create-home --uid 10001 harvest \
    && mkdir -p /var/run/harvest-metrics \
    && chown harvest /var/run/harvest-metrics
USER harvest

CMD ["harvest", "--help"]
