# abwatch service image: the CLI, git, and everything the tvm-source builder needs to build
# Apache TVM from source (g++, LLVM 19 with its llvm-config, CMake/Ninja/ccache from PyPI
# through the `source` extra). Used by docker-compose.yml for `abwatch watch` and `abwatch worker`.
FROM python:3.11-slim-trixie
RUN apt-get update && apt-get install -y --no-install-recommends \
        git ca-certificates gcc g++ libc6-dev make valgrind bubblewrap \
        llvm-19-dev zlib1g-dev libzstd-dev libxml2-dev libedit-dev libtinfo-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service service
COPY builders builders
COPY runners runners
COPY core core
COPY migrations migrations
COPY config config
RUN pip install --no-cache-dir '.[source]' && pip install --no-cache-dir --no-deps 'apache-otava==0.8.0'
# the unprivileged host user code under test runs as ([sandbox] user; README, Security)
RUN useradd --system --no-create-home --shell /usr/sbin/nologin abwatch-sandbox
# where the tvm-source builder finds LLVM (config: cmake = {USE_LLVM = "/usr/lib/llvm-19/bin/llvm-config"})
ENV ABWATCH_DATABASE_URL=postgresql+psycopg2://abwatch@db/abwatch \
    LLVM_CONFIG=/usr/lib/llvm-19/bin/llvm-config
ENTRYPOINT ["abwatch"]
CMD ["--help"]
