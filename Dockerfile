# abwatch service image: the CLI plus a C toolchain for `command` builds.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service service
COPY builders builders
COPY runners runners
COPY migrations migrations
COPY config config
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps 'apache-otava==0.8.0'
ENV ABWATCH_DATABASE_URL=postgresql+psycopg2://abwatch@db/abwatch
ENTRYPOINT ["abwatch"]
CMD ["--help"]
