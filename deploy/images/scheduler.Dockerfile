# The scheduler on an empty root with only the C runtime it links, as nobody. It needs
# nothing from the host: NATS over the network, its credentials mounted read-only.
FROM scratch
COPY root/ /
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/tangram-scheduler"]
