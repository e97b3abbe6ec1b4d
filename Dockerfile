# Multi-stage build: compile in the Rust image, run on a slim Debian.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin filedock

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/filedock filedock \
    && mkdir -p /var/lib/filedock && chown filedock /var/lib/filedock
COPY --from=build /src/target/release/filedock /usr/local/bin/filedock
USER filedock
ENV FILEDOCK_BIND=0.0.0.0:8080 FILEDOCK_DATA_DIR=/var/lib/filedock
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["filedock"]
CMD ["serve"]
