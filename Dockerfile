# nop-stream: the `nopstream` binary with etcd election, for coordinators and nodes.
#
#   docker build -t nopstream .
#
# The build needs only the package registries (crates.io, Debian); the bundled plugins are
# compiled in the builder (wasm32-wasip2) and shipped with the binary.

FROM rust:1.95-bookworm AS builder
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN cargo build --release -p nop-stream-cli --features etcd \
 && mkdir -p /out/plugins \
 && cp target/release/nopstream /out/ \
 && cp target/wasm32/wasm32-wasip2/release/*.wasm /out/plugins/

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/nopstream nopstream
COPY --from=builder /out/nopstream /usr/local/bin/nopstream
COPY --from=builder /out/plugins /usr/local/share/nopstream/plugins
USER 10001:10001
WORKDIR /var/lib/nopstream
ENV NOPSTREAM_PLUGIN_PATH=/usr/local/share/nopstream/plugins
# 7400/udp: the coordinator (nodes and the CLI, QUIC); 7500/udp: a node's data endpoint.
EXPOSE 7400/udp 7500/udp
ENTRYPOINT ["/usr/local/bin/nopstream"]
CMD ["--help"]
