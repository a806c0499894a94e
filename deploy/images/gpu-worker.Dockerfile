# The GPU worker with Python (for the reference replica; vLLM or SGLang replicas run as
# containers of their own images, or from an image built on this one). Non-root: it needs
# no Docker socket when its replicas are processes, only the GPUs (when real) and its state
# directory.
ARG BASE
FROM ${BASE}
COPY root/ /
RUN mkdir -p /var/lib/tangram && chown 65534:65534 /var/lib/tangram
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/tangram-worker"]
