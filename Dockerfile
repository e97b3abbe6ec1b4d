# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run on a slim Debian. The
# registry and the target directory are BuildKit cache mounts, so a rebuild
# after a source change compiles filedock only, not its dependencies.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin filedock \
    && cp target/release/filedock /usr/local/bin/filedock

# Runs as a numeric non-root user (Kubernetes' runAsNonRoot can check a
# number, not a name) and writes only to the data dir, a volume: the root
# filesystem may be read-only (`docker run --read-only`, Kubernetes'
# readOnlyRootFilesystem; deploy/kubernetes).
FROM debian:12.8-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 filedock \
    && useradd --system --uid 10001 --gid 10001 --home /var/lib/filedock filedock \
    && mkdir -p /var/lib/filedock && chown 10001:10001 /var/lib/filedock
COPY --from=build /usr/local/bin/filedock /usr/local/bin/filedock
USER 10001:10001
ENV FILEDOCK_BIND=0.0.0.0:8080 FILEDOCK_DATA_DIR=/var/lib/filedock
VOLUME /var/lib/filedock
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["filedock"]
CMD ["serve"]
