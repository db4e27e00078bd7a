#!/usr/bin/env bash
# One idempotent setup for trainstack. Each step checks whether its result is
# already there and does nothing if so; a failed step names itself, the command it
# ran and the last lines of its log, and the next run resumes from it.
#
#   scripts/setup.sh            all steps
#   scripts/setup.sh STEP...    only these steps (names as printed)
#
# Settings: TRAINSTACK_PLUGIN_SOURCES (the folder with python-langhost/, docker-provider/
# and command-provider/, built when Pulumi's download sites do not answer; default
# ../shared/pulumi-src beside the clone), TRAINSTACK_CACHE, TRAINSTACK_USE_SYSTEM_PULUMI.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
. "$ROOT/versions.env"
TRAINSTACK_BASE_IMAGE=${TRAINSTACK_BASE_IMAGE_OVERRIDE:-$TRAINSTACK_BASE_IMAGE}

TOOLS="$ROOT/tools"
BIN="$TOOLS/bin"
VENV="$ROOT/.venv"
STATE="$ROOT/.setup"
LOGS="$STATE/logs"
# Built toolchains are also kept per user, so a second clone reuses them.
CACHE="${TRAINSTACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainstack}"
DOCKERD_LOG="${TRAINSTACK_DOCKERD_LOG:-$STATE/dockerd.log}"
# Sources of the official plugins that cannot be downloaded here (air-gapped machines):
# a folder with python-langhost/, docker-provider/ and command-provider/. Read only; builds
# copy it first.
if [ -z "${TRAINSTACK_PLUGIN_SOURCES:-}" ] && [ -d "$ROOT/../shared/pulumi-src" ]; then
  TRAINSTACK_PLUGIN_SOURCES=$(cd "$ROOT/../shared/pulumi-src" && pwd)
fi
PLUGIN_SOURCES=${TRAINSTACK_PLUGIN_SOURCES:-}
mkdir -p "$BIN" "$LOGS" "$CACHE"
export PATH="$PATH:/usr/local/go/bin"
eval "$("$ROOT/scripts/env.sh")"

say() { printf '[setup] %s\n' "$*"; }

# run_step NAME FUNCTION: times the step, logs its output, explains failures.
run_step() {
  local name=$1 fn=$2 start log rc
  start=$(date +%s)
  log="$LOGS/$name.log"
  : >"$log"
  say "$name ..."
  set +e
  ( set -euo pipefail; "$fn" ) >>"$log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    say "FAILED step '$name' (exit $rc). Last lines of $log:"
    tail -n 25 "$log" | sed 's/^/    /'
    say "Fix the cause and run 'make setup' again; finished steps are not redone."
    exit $rc
  fi
  say "$name: $(tail -n 1 "$log") ($(( $(date +%s) - start ))s)"
}

# Each step prints what it did as its last line.
log_cmd() { printf '+ %s\n' "$*"; "$@"; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "need root to apt-get install $*; install them yourself or run setup as root"
    return 1
  fi
  if [ ! -f "$STATE/apt-updated" ]; then
    log_cmd apt-get update -qq
    touch "$STATE/apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive log_cmd apt-get install -y -qq --no-install-recommends "$@"
}

step_os_packages() {
  local missing=()
  command -v curl >/dev/null || missing+=(curl)
  command -v git >/dev/null || missing+=(git)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  # Provisioning copies the wheel sets to the nodes with rsync (ansible.posix.synchronize).
  command -v rsync >/dev/null || missing+=(rsync)
  if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
  echo "present: curl git python3-venv rsync"
}

# Not in a plain `make setup`: the engine tests' real browser (tests/support/browser.py opens the
# MLflow UI in it). `make test-engine` runs this step; a user's setup never installs a browser.
step_browser() {
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "chromium present: $(command -v chromium)"
    return
  fi
  apt_install chromium chromium-driver
  echo "chromium installed: $(command -v chromium)"
}

step_java() {
  if java -version 2>&1 | grep -q 'version "17'; then
    echo "Java 17 present: $(command -v java)"
    return
  fi
  apt_install openjdk-17-jre-headless
  java -version 2>&1 | head -n 1
}

step_docker_engine() {
  if docker info >/dev/null 2>&1; then
    echo "using the engine that answers: $(docker info --format '{{.ServerVersion}}' 2>/dev/null)"
    return
  fi
  if ! command -v dockerd >/dev/null; then
    apt_install docker.io
  fi
  if ! docker info >/dev/null 2>&1; then
    echo "starting dockerd in the background, log: $DOCKERD_LOG"
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 60); do
      docker info >/dev/null 2>&1 && break
      sleep 1
    done
  fi
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within 60 s; see $DOCKERD_LOG"
    tail -n 20 "$DOCKERD_LOG"
    return 1
  fi
  echo "started dockerd $(docker info --format '{{.ServerVersion}}'), log: $DOCKERD_LOG"
}

step_base_image() {
  local image=$TRAINSTACK_BASE_IMAGE rootfs
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "image $image present"
    return
  fi
  if timeout 60 docker pull "$image"; then
    echo "pulled $image"
    return
  fi
  echo "no registry answered; building $image locally with debootstrap"
  command -v debootstrap >/dev/null || apt_install debootstrap
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/trainstack-rootfs.XXXXXX")
  # python3 lets Ansible manage the node without a bootstrap round trip.
  log_cmd debootstrap --variant=minbase --include=python3,ca-certificates \
    "$TRAINSTACK_DEBIAN_SUITE" "$rootfs" "$TRAINSTACK_DEBIAN_MIRROR"
  tar -C "$rootfs" -c . | docker import \
    -c 'CMD ["/bin/bash"]' \
    -c 'LABEL org.trainstack.built-by=debootstrap' \
    - "$image"
  rm -rf "$rootfs"
  echo "built $image locally ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
}

pulumi_version_ok() {
  [ -x "$BIN/pulumi" ] && [ "$("$BIN/pulumi" version 2>/dev/null)" = "v$PULUMI_VERSION" ]
}

# The SDK module carries the scripts the CLI's release archive ships beside it.
sdk_module_dir() {
  local dir
  dir=$(cd "$TOOLS" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/pulumi/pulumi/sdk/v3@v$PULUMI_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$dir" ] || { echo "could not download the sdk/v3 module"; return 1; }
  echo "$dir"
}

build_pulumi_from_modules() {
  command -v go >/dev/null || { echo "Go is needed to build the Pulumi CLI; install golang"; return 1; }
  local work=$STATE/pulumi-build
  mkdir -p "$work"
  # A throwaway wrapper module: pkg/v3 and sdk/v3 at one version. Their own go.mod
  # files carry local-path replace lines, so `go install pkg@version` is refused.
  cat >"$work/go.mod" <<EOF
module trainstack.local/pulumi-build

go 1.24

require (
	github.com/pulumi/pulumi/pkg/v3 v$PULUMI_VERSION
	github.com/pulumi/pulumi/sdk/v3 v$PULUMI_VERSION
)
EOF
  cat >"$work/tools.go" <<'EOF'
//go:build tools

package tools

import _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
EOF
  (cd "$work" && log_cmd go mod tidy && log_cmd go build -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_VERSION" \
    -o "$work/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
  install -m 0755 "$work/pulumi" "$BIN/pulumi"
}

step_pulumi_cli() {
  local cached="$CACHE/pulumi-v$PULUMI_VERSION/pulumi"
  if [ "${TRAINSTACK_USE_SYSTEM_PULUMI:-0}" = 1 ]; then
    echo "using the Pulumi CLI on PATH: $(command -v pulumi) $(pulumi version)"
    return
  fi
  if pulumi_version_ok; then
    echo "pulumi v$PULUMI_VERSION present in $BIN"
    return
  fi
  if [ -x "$cached" ]; then
    install -m 0755 "$cached" "$BIN/pulumi"
    echo "pulumi v$PULUMI_VERSION from the user cache $cached"
    return
  fi
  if timeout 20 curl -fsSL -o "$STATE/get-pulumi.sh" https://get.pulumi.com 2>/dev/null; then
    echo "official installer reachable; installing v$PULUMI_VERSION"
    sh "$STATE/get-pulumi.sh" --version "$PULUMI_VERSION" --install-root "$STATE/pulumi-official" --no-edit-path
    install -m 0755 "$STATE/pulumi-official/bin/pulumi" "$BIN/pulumi"
  else
    echo "official installer not reachable; building from the Go module proxy (takes a while once)"
    build_pulumi_from_modules
  fi
  mkdir -p "$(dirname "$cached")"
  cp "$BIN/pulumi" "$cached"
  echo "installed $("$BIN/pulumi" version) into $BIN"
}

# The folder of plugin sources named by TRAINSTACK_PLUGIN_SOURCES, checked; else says
# what is missing and how to provide it.
plugin_sources() {
  local sub=$1 what=$2 why=$3
  if [ -n "$PLUGIN_SOURCES" ] && [ -d "$PLUGIN_SOURCES/$sub" ]; then
    echo "$PLUGIN_SOURCES/$sub"
    return
  fi
  {
    echo "cannot get $what: $why, and no sources were found"
    echo "(looked for the folder ${PLUGIN_SOURCES:-<TRAINSTACK_PLUGIN_SOURCES unset>}/$sub)."
    echo "Either run setup on a machine that reaches get.pulumi.com and github.com, or"
    echo "export TRAINSTACK_PLUGIN_SOURCES=/path/to/pulumi-src (the folder holding"
    echo "python-langhost/, docker-provider/ and command-provider/, default ../shared/pulumi-src)"
    echo "and run it again."
  } >&2
  return 1
}

# A writable copy of a read-only source folder, fresh each time (the build writes in it).
writable_copy() {
  local src=$1 dst=$2
  rm -rf "$dst"
  mkdir -p "$(dirname "$dst")"
  cp -R "$src" "$dst"
  chmod -R u+w "$dst"
}

# Copies FILES from DIR into the per-user cache DEST atomically (other clones read it).
cache_files() {
  local dir=$1 dest=$2 tmp f
  shift 2
  tmp=$(mktemp -d "$(dirname "$dest")/.tmp.XXXXXX")
  chmod 0755 "$tmp"
  for f in "$@"; do install -m 0755 "$dir/$f" "$tmp/$f"; done
  rm -rf "$dest"
  mv "$tmp" "$dest"
}

PYTHON_HOST_FILES=(pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python)

python_host_ok() {
  local dir=$1 f
  for f in "${PYTHON_HOST_FILES[@]}"; do [ -x "$dir/$f" ] || return 1; done
  [ "$("$dir/pulumi-language-python" -version 2>/dev/null)" = "v$PULUMI_VERSION" ]
}

build_python_host() {
  local src work=$STATE/plugin-build/python-langhost sdk
  command -v go >/dev/null || { echo "Go is needed to build pulumi-language-python; install golang"; return 1; }
  src=$(plugin_sources python-langhost "the Python language host (pulumi-language-python)" \
    "the official installer was not used (get.pulumi.com unreachable) and it is not cached")
  echo "building pulumi-language-python v$PULUMI_VERSION from $src (copied to $work)"
  writable_copy "$src" "$work"
  (cd "$work" && CGO_ENABLED=0 log_cmd go build -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_VERSION" \
    -o pulumi-language-python .)
  # The dynamic-provider host script ships with the SDK module, beside the launcher.
  sdk=$(sdk_module_dir)
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$work/pulumi-resource-pulumi-python"
}

step_pulumi_python_host() {
  local cache="$CACHE/pulumi-language-python-v$PULUMI_VERSION" official=$STATE/pulumi-official/bin
  local src from f
  if [ "${TRAINSTACK_USE_SYSTEM_PULUMI:-0}" = 1 ] && [ -x "$(dirname "$(command -v pulumi)")/pulumi-language-python" ]; then
    echo "using the language host next to the system CLI: $(dirname "$(command -v pulumi)")"
    return
  fi
  if python_host_ok "$BIN"; then
    echo "pulumi-language-python v$PULUMI_VERSION present in $BIN"
    return
  fi
  if python_host_ok "$official"; then
    # The official installer's archive ships the host and its scripts beside pulumi.
    src=$official from="the official release archive"
  elif python_host_ok "$cache"; then
    src=$cache from="the user cache $cache"
  else
    build_python_host
    src=$STATE/plugin-build/python-langhost from="a build from source"
  fi
  for f in "${PYTHON_HOST_FILES[@]}"; do install -m 0755 "$src/$f" "$BIN/$f"; done
  [ "$src" = "$cache" ] || cache_files "$src" "$cache" "${PYTHON_HOST_FILES[@]}"
  rm -rf "$STATE/plugin-build/python-langhost"
  echo "pulumi-language-python $("$BIN/pulumi-language-python" -version) and its scripts in $BIN (from $from)"
}

# resource_plugin_listed NAME VERSION: `pulumi plugin ls` lists the resource plugin.
resource_plugin_listed() {
  pulumi plugin ls 2>/dev/null |
    awk -v n="$1" -v v="$2" '$1 == n && $2 == "resource" && $3 == v { found = 1 } END { exit !found }'
}

docker_provider_listed() { resource_plugin_listed docker "$PULUMI_DOCKER_PROVIDER_VERSION"; }

build_docker_provider() {
  local src work=$STATE/plugin-build/docker-provider v=$PULUMI_DOCKER_PROVIDER_VERSION
  command -v go >/dev/null || { echo "Go is needed to build pulumi-resource-docker; install golang"; return 1; }
  src=$(plugin_sources docker-provider "the docker provider plugin (pulumi-resource-docker)" \
    "the download failed and it is not cached")
  echo "building pulumi-resource-docker v$v from $src (copied to $work)"
  # provider/go.mod replaces modules with ../upstream and ../gomod-stubs: copy all of it.
  writable_copy "$src" "$work"
  (
    cd "$work/provider"
    export CGO_ENABLED=0
    log_cmd go mod download
    VERSION=$v log_cmd go generate cmd/pulumi-resource-docker/main.go
    log_cmd go build -trimpath -tags no_compose \
      -ldflags "-s -w -X github.com/pulumi/pulumi-docker/provider/v5/pkg/version.Version=$v" \
      -o pulumi-resource-docker ./cmd/pulumi-resource-docker
  )
}

# install_resource_plugin KIND VERSION BUILD: the official provider plugin
# pulumi-resource-KIND, from Pulumi's release sites, else the per-user cache, else BUILD (a
# function that builds it from source in $STATE/plugin-build/KIND-provider/provider).
install_resource_plugin() {
  local kind=$1 v=$2 build=$3
  local cache="$CACHE/pulumi-resource-$kind-v$v" work=$STATE/plugin-build/$kind-provider from
  if resource_plugin_listed "$kind" "$v"; then
    echo "plugin resource $kind $v present ($PULUMI_HOME/plugins)"
    return
  fi
  # The official way: a download from Pulumi's release sites.
  if log_cmd timeout 60 pulumi plugin install resource "$kind" "$v"; then
    resource_plugin_listed "$kind" "$v" || { echo "pulumi plugin install succeeded but plugin ls does not list $kind $v"; return 1; }
    echo "plugin resource $kind $v downloaded (pulumi plugin install)"
    return
  fi
  echo "download failed; using the user cache or building from source"
  if [ -x "$cache/pulumi-resource-$kind" ]; then
    from="the user cache $cache"
  else
    "$build"
    cache_files "$work/provider" "$cache" "pulumi-resource-$kind"
    from="a build from source"
  fi
  # Installed into the plugin cache, not on PATH.
  log_cmd pulumi plugin install resource "$kind" "$v" --file "$cache/pulumi-resource-$kind"
  rm -rf "$work"
  resource_plugin_listed "$kind" "$v" || { echo "pulumi plugin ls does not list $kind $v after the install"; return 1; }
  echo "plugin resource $kind $v installed from $from"
}

step_pulumi_docker_provider() {
  install_resource_plugin docker "$PULUMI_DOCKER_PROVIDER_VERSION" build_docker_provider
}

command_provider_listed() { resource_plugin_listed command "$PULUMI_COMMAND_PROVIDER_VERSION"; }

build_command_provider() {
  local src work=$STATE/plugin-build/command-provider v=$PULUMI_COMMAND_PROVIDER_VERSION
  command -v go >/dev/null || { echo "Go is needed to build pulumi-resource-command; install golang"; return 1; }
  src=$(plugin_sources command-provider "the command provider plugin (pulumi-resource-command)" \
    "the download failed and it is not cached")
  echo "building pulumi-resource-command v$v from $src (copied to $work)"
  # The build writes go.sum entries into the folder: build a copy.
  writable_copy "$src" "$work"
  (
    cd "$work/provider"
    CGO_ENABLED=0 log_cmd go mod download
    CGO_ENABLED=0 log_cmd go build -trimpath \
      -ldflags "-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$v" \
      -o pulumi-resource-command ./cmd/pulumi-resource-command
  )
}

step_pulumi_command_provider() {
  install_resource_plugin command "$PULUMI_COMMAND_PROVIDER_VERSION" build_command_provider
}

venv_stamp() {
  cat constraints.txt pyproject.toml training/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16
}

step_python_env() {
  local stamp
  stamp=$(venv_stamp)
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.trainstack-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "virtual environment $VENV up to date"
    return
  fi
  [ -x "$VENV/bin/python" ] || log_cmd python3 -m venv "$VENV"
  # pip stays in the venv (the wheelhouse for the nodes is built with it); the packages go in
  # with uv, which installs the same pinned set from its cache in a third of pip's time.
  log_cmd "$VENV/bin/pip" install -q --upgrade pip "uv==$UV_VERSION"
  local uv=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
  log_cmd "${uv[@]}" -c constraints.txt -e ".[dev]"
  if [ -f training/pyproject.toml ]; then
    log_cmd "${uv[@]}" -c constraints.txt -e training/
    # tf-keras' metadata drags in the full `tensorflow` over `tensorflow-cpu`.
    log_cmd "${uv[@]}" --no-deps "tf-keras==$(grep -iE '^tf[-_]keras==' constraints.txt | cut -d= -f3)"
  fi
  # uv builds pyspark (an sdist only) into a new cache revision on every install here, 1.3 GB
  # each; pruning keeps the cache to what is in use.
  log_cmd "$VENV/bin/uv" cache prune -q
  echo "$stamp" >"$VENV/.trainstack-stamp"
  echo "virtual environment $VENV ready ($("$VENV/bin/python" --version))"
}

step_promtool() {
  # promtool checks the Prometheus config and alert rules in `make lint`. It comes from the
  # same Debian package the nodes run (prometheus), unpacked here: no daemon on this machine.
  if "$BIN/promtool" --version >/dev/null 2>&1; then
    echo "promtool present: $("$BIN/promtool" --version 2>&1 | head -n 1)"
    return
  fi
  local work
  work=$(mktemp -d)
  if [ ! -f "$STATE/apt-updated" ] && [ "$(id -u)" = 0 ]; then
    log_cmd apt-get update -qq
    touch "$STATE/apt-updated"
  fi
  (cd "$work" && log_cmd apt-get download -qq prometheus)
  log_cmd dpkg-deb -x "$(ls "$work"/prometheus_*.deb)" "$work/root"
  install -m 0755 "$work/root/usr/bin/promtool" "$BIN/promtool"
  rm -rf "$work"
  echo "promtool installed in $BIN: $("$BIN/promtool" --version 2>&1 | head -n 1)"
}

step_pulumi_backend() {
  mkdir -p "$ROOT/.pulumi-state"
  chmod 0700 "$ROOT/.pulumi-state"
  local pass="$ROOT/.pulumi-state/passphrase"
  if [ ! -s "$pass" ]; then
    # Default passphrase for local stacks: random, in a 0600 file, never printed.
    (umask 077 && head -c 24 /dev/urandom | base64 >"$pass")
  fi
  chmod 0600 "$pass"
  echo "backend file://$ROOT/.pulumi-state, passphrase file $pass"
}

step_check() {
  pulumi version >/dev/null
  pulumi plugin ls >/dev/null
  echo "pulumi $(pulumi version); language python $(pulumi-language-python -version 2>/dev/null || echo missing);" \
    "docker provider $(docker_provider_listed && echo "$PULUMI_DOCKER_PROVIDER_VERSION" || echo missing);" \
    "command provider $(command_provider_listed && echo "$PULUMI_COMMAND_PROVIDER_VERSION" || echo missing);" \
    "python $("$VENV/bin/python" --version 2>&1 | cut -d' ' -f2)"
}

ALL_STEPS=(os_packages java docker_engine base_image pulumi_cli python_env promtool pulumi_python_host
  pulumi_docker_provider pulumi_command_provider pulumi_backend check)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${ALL_STEPS[@]}")
total_start=$(date +%s)
for s in "${steps[@]}"; do
  declare -F "step_$s" >/dev/null || { say "unknown step '$s'; steps: ${ALL_STEPS[*]} browser"; exit 2; }
  run_step "$s" "step_$s"
done
touch "$STATE/done"
say "setup complete in $(( $(date +%s) - total_start ))s"
