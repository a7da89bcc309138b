# syntax=docker/dockerfile:1
# Multi-stage: build with the Rust toolchain, run from a small distroless image as a
# non-root user. The same image runs the proxy, `migrate`, and the demo provider.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked --bin idemproxy
# The embedded store's directory, created here: the runtime image has no shell.
RUN mkdir -p /state

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/idemproxy /usr/local/bin/idemproxy
COPY config /etc/idemproxy
# The embedded store lives in /var/lib/idemproxy, owned by the image's user (nonroot,
# uid 65532) and declared a volume: a sidecar keeps its keys across restarts only if a
# volume is mounted here. Relative store paths (./idemproxy.db) land in it too.
COPY --from=build --chown=65532:65532 /state /var/lib/idemproxy
VOLUME ["/var/lib/idemproxy"]
WORKDIR /var/lib/idemproxy
USER nonroot:nonroot
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/idemproxy"]
CMD ["serve", "--config", "/etc/idemproxy/quickstart.yaml", "--listen", "0.0.0.0:8080"]
