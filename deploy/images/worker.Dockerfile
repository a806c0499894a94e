# The CPU worker on an empty root with only the C runtime it links. It runs as root because
# it drives the host's Docker engine (the socket) and writes the host's cgroup tree (core
# grants, freezing and killing a sandbox's processes); docs/DEPLOY.md lists its mounts.
FROM scratch
COPY root/ /
ENTRYPOINT ["/usr/local/bin/tangram-worker"]
