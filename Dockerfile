# Builds the one gpuplace binary. NVML is loaded at run time, so the image needs no driver.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p gpuplace

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/gpuplace /usr/local/bin/gpuplace
ENTRYPOINT ["/usr/local/bin/gpuplace"]
