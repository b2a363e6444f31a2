#!/usr/bin/env bash
# Start a private Docker daemon for the `docker` sandbox backend and build its offline image.
#
# Idempotent: a running daemon is reused, and so is an image built from the same package list (a label
# records it; a changed list rebuilds the image). Logs go to stderr; the last line on
# stdout is `DOCKER_HOST=unix://...` for the caller to export. Needs root (dockerd, debootstrap) and
# the Debian mirror plus PyPI once, to install packages and build the image; containers then run
# without any network.
#
# The daemon gets its own data root, exec root and socket, and never touches iptables, IP forwarding
# or bridges: sandboxes only use network_mode=none, so the host network is left exactly as it was.
#
# Environment:
#   GYMFORGE_DOCKER_DIR       state directory (default /var/lib/gymforge-docker)
#   GYMFORGE_DOCKER_RUN       socket/exec directory, kept short for the socket path limit (default /run/gymforge-docker)
#   GYMFORGE_SANDBOX_IMAGE    image to build (default gymforge-sandbox:latest)
#   GYMFORGE_SANDBOX_PACKAGES pip packages installed in the image's /opt/venv. The default has PyTorch's CPU
#                             build (torchrun, for language-model tasks): pip finds `torch==...+cpu` in a local
#                             wheel folder (PIP_FIND_LINKS) or, elsewhere, with
#                             PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
#   PYTHON                    interpreter whose pip downloads the wheels (default python3)
set -euo pipefail

STATE=${GYMFORGE_DOCKER_DIR:-/var/lib/gymforge-docker}
RUN=${GYMFORGE_DOCKER_RUN:-/run/gymforge-docker}
IMAGE=${GYMFORGE_SANDBOX_IMAGE:-gymforge-sandbox:latest}
BASE=gymforge-sandbox-base:bookworm
PACKAGES=${GYMFORGE_SANDBOX_PACKAGES:-numpy pandas scikit-learn scipy datasets torch==2.13.0+cpu}
PYTHON=${PYTHON:-python3}
SOCK=$RUN/docker.sock

# One setup at a time (parallel test workers may all ask for the daemon): the others wait, then reuse it.
mkdir -p "$(dirname "$STATE")"
exec 9>"$STATE.setup.lock"
flock -w 1200 9 || { echo "docker_sandbox: error: another setup held $STATE.setup.lock for 20 min" >&2; exit 1; }
export DOCKER_HOST=unix://$SOCK
# The legacy builder needs no buildx plugin and honours --network=none.
export DOCKER_BUILDKIT=0

log() { echo "docker_sandbox: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it starts dockerd)"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]}"
    # DPkg::Lock::Timeout: wait for another setup's apt-get (a parallel test worker's) instead of failing.
    { apt-get -o DPkg::Lock::Timeout=600 update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}"; } >&2 \
        || die "apt-get install ${missing[*]} failed"
fi

if ! docker info >/dev/null 2>&1; then
    mkdir -p "$STATE/data" "$RUN/exec"
    log "starting dockerd on $SOCK (log: $STATE/dockerd.log)"
    # setsid + nohup: the daemon must outlive this script and the shell that called it. `9>&-`: the daemon must
    # not inherit the setup lock, or it would hold it for its whole life and the next setup would wait forever.
    setsid nohup dockerd \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
        --data-root "$STATE/data" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
        -H "unix://$SOCK" >"$STATE/dockerd.log" 2>&1 </dev/null 9>&- &
    for _ in $(seq 100); do
        docker info >/dev/null 2>&1 && break
        kill -0 $! 2>/dev/null || die "dockerd exited: $(tail -5 "$STATE/dockerd.log")"
        sleep 0.3
    done
    docker info >/dev/null 2>&1 || die "dockerd not ready after 30 s: $(tail -5 "$STATE/dockerd.log")"
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    rootfs=$(mktemp -d "$STATE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    log "debootstrap bookworm minbase into $rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,procps bookworm "$rootfs" >&2 \
        || die "debootstrap failed (is the Debian mirror reachable?)"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import - "$BASE" >&2
    rm -rf "$rootfs"
    trap - EXIT
fi

built_with=$(docker image inspect -f '{{index .Config.Labels "gymforge.packages"}}' "$IMAGE" 2>/dev/null || true)
if [ "$built_with" != "$PACKAGES" ]; then
    [ -z "$built_with" ] || log "rebuilding $IMAGE: built with '$built_with', now '$PACKAGES'"
    old_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    ctx=$(mktemp -d "$STATE/build.XXXXXX")
    trap 'rm -rf "$ctx"' EXIT
    log "downloading wheels for: $PACKAGES"
    # Wheels for the image's interpreter (Debian bookworm: CPython 3.11, glibc 2.36), whatever the host runs.
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download -q --dest "$ctx/wheels" --only-binary=:all: \
        --implementation cp --python-version 3.11 --abi cp311 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        $PACKAGES >&2 || die "pip download failed (is PyPI reachable?)"
    cat >"$ctx/Dockerfile" <<EOF
FROM $BASE
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/venv \\
 && /opt/venv/bin/pip install -q --no-index --find-links /tmp/wheels $PACKAGES \\
 && rm -rf /tmp/wheels /root/.cache
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
WORKDIR /workspace
LABEL gymforge.packages="$PACKAGES"
EOF
    log "building $IMAGE"
    docker build -q --network=none -t "$IMAGE" "$ctx" >&2 || die "docker build failed"
    # the replaced image, now untagged (kept if a container still uses it)
    [ -z "$old_id" ] || docker rmi "$old_id" >/dev/null 2>&1 || true
    rm -rf "$ctx"
    trap - EXIT
fi

log "ready: image $IMAGE"
echo "DOCKER_HOST=$DOCKER_HOST"
