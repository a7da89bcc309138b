# syntax=docker/dockerfile:1
# Multi-stage: build with the Rust toolchain, run from a small distroless image as a
# non-root user. The same image runs the proxy, `migrate`, and the demo provider.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own (built against stub sources): a change
# to the proxy's code rebuilds the proxy, not the ~200 crates under it.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin/idemproxy \
 && echo 'fn main() {}' > src/bin/idemproxy/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked --bin idemproxy \
 && rm -rf src
COPY src ./src
COPY migrations ./migrations
# COPY keeps the sources' old times, which cargo would take for "the stub's build is newer".
RUN touch src/lib.rs src/bin/idemproxy/main.rs \
 && cargo build --release --locked --bin idemproxy
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
# The default command serves on every interface of the container, the admin listener
# (health, metrics, the key admin API) too, so it needs a bearer token: without
# IDEMPROXY_ADMIN_TOKEN it refuses to start and says so.
# Its upstream is quickstart.yaml's http://127.0.0.1:3000: an app in the same network
# namespace (a sidecar in the app's pod).
#   docker run -e IDEMPROXY_ADMIN_TOKEN=… -v idemproxy-keys:/var/lib/idemproxy --network container:APP IMAGE
CMD ["serve", "--config", "/etc/idemproxy/quickstart.yaml", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9090"]
