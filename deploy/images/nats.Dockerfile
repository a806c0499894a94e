# nats-server (the pinned release, a static binary) on an empty root, as nobody. Its store
# is /data (a volume); its configuration comes from the deploy (mounted), and the tangram CLI
# is there for the health check (`tangram probe` on the monitoring port).
FROM scratch
COPY root/ /
COPY --chown=65534:65534 data/ /data/
USER 65534:65534
EXPOSE 4222 6222 8222
ENTRYPOINT ["/usr/local/bin/nats-server"]
