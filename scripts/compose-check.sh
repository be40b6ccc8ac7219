#!/usr/bin/env bash
# Validates compose files the way `docker compose config` does, without a Docker engine: with
# compose-go, the library Docker Compose v2 loads files with (scripts/compose-check/main.go:
# schema, interpolation, normalization, consistency checks, bind-mount sources and build
# contexts exist; loader warnings are errors). Prints the normalized project (YAML, or JSON
# with --json); exits non-zero with the reason on stderr when a file is invalid. Where the
# real client is there (`docker compose version` works), also runs `docker compose config -q`.
#
#   scripts/compose-check.sh                     the repository's docker-compose.yml
#   scripts/compose-check.sh --json FILE...      these files (the first one's dir is the project dir)
#   scripts/compose-check.sh -q                  validate only, print nothing on success
#
# The checker is built once into ${TESSEL_KAFKA_CACHE:-~/.cache/tessel-kafka}/compose-check/,
# outside the clone, and rebuilt only when its main.go, go.mod or go.sum (or Go) change.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
src="$repo/scripts/compose-check"
cache="${TESSEL_KAFKA_CACHE:-$HOME/.cache/tessel-kafka}/compose-check"

command -v go >/dev/null || { echo "[compose-check] go is missing: run scripts/deps" >&2; exit 1; }
go_minor="$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
if [[ -z "$go_minor" ]] || ((go_minor < 24)); then
  echo "[compose-check] $(go version) is too old: compose-go needs Go >= 1.24" >&2
  exit 1
fi
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false"

mkdir -p "$cache"
stamp="$( { cat "$src/main.go" "$src/go.mod" "$src/go.sum"; go version; } | sha256sum | cut -c1-16)"
bin="$cache/compose-check-$stamp"
if [[ ! -x "$bin" ]]; then
  # One build at a time (tests run this in parallel); the binary appears whole or not at all.
  exec 9>"$cache/build.lock"
  flock 9
  if [[ ! -x "$bin" ]]; then
    echo "[compose-check] building the checker (compose-go) into $cache" >&2
    started=$SECONDS
    (cd "$src" && go build -trimpath -o "$bin.tmp.$$" .)
    mv -f "$bin.tmp.$$" "$bin"
    find "$cache" -maxdepth 1 -name 'compose-check-*' ! -name "compose-check-$stamp" -delete
    echo "[compose-check] built in $((SECONDS - started))s" >&2
  fi
  exec 9>&-
fi

flags=()
files=()
for a in "$@"; do
  case "$a" in
    -*) flags+=("$a") ;;
    *) files+=("$a") ;;
  esac
done
((${#files[@]})) || files=("$repo/docker-compose.yml")

"$bin" --strict "${flags[@]}" "${files[@]}"

if docker compose version >/dev/null 2>&1; then
  args=()
  for f in "${files[@]}"; do args+=(-f "$f"); done
  echo "[compose-check] docker compose config -q" >&2
  docker compose "${args[@]}" config -q
fi
