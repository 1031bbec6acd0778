# syntax=docker/dockerfile:1
#
# The platform-mesh image: the release binary, built with the etcd backend from the locked
# dependency versions, alone on a distroless base, run as the non-root user 65532.
#
#   docker build -t platform-mesh:latest .
#   docker run --rm -p 6443:6443 platform-mesh:latest
#
# The Deployment in deploy/aggregation and the chart in deploy/chart run it with
# `serve --listen=0.0.0.0:6443 --data-dir=/var/lib/platform-mesh ...` and a volume at that path.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# protoc and the well-known protobuf types build the etcd client.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The target directory is a cache mount, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features etcd --bin platform-mesh \
 && install -D -m 0755 target/release/platform-mesh /out/platform-mesh
# An empty data directory the non-root user owns, so that `docker run` without a volume (and an
# anonymous volume made from the image) can be written.
RUN install -d -m 0700 -o 65532 -g 65532 /out/data

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/platform-mesh /usr/local/bin/platform-mesh
COPY --from=build --chown=65532:65532 /out/data /var/lib/platform-mesh
# `serve` reads these when its --listen and --data-dir flags are not given.
ENV PLATFORM_MESH_LISTEN=0.0.0.0:6443 \
    PLATFORM_MESH_DATA_DIR=/var/lib/platform-mesh
VOLUME ["/var/lib/platform-mesh"]
EXPOSE 6443
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/platform-mesh"]
CMD ["serve"]
