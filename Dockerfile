# syntax=docker/dockerfile:1
# Multi-stage: build with the Rust toolchain, run from a small distroless image as a
# non-root user. The same image runs the proxy, `migrate`, and the demo provider.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN cargo build --release --locked --bin idemproxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/idemproxy /usr/local/bin/idemproxy
COPY config /etc/idemproxy
# The embedded store writes ./idemproxy.db; give it a directory the non-root user owns.
WORKDIR /home/nonroot
USER nonroot:nonroot
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/idemproxy"]
CMD ["serve", "--config", "/etc/idemproxy/quickstart.yaml", "--listen", "0.0.0.0:8080"]
