#!/usr/bin/env bash
# Regenerate the Go protobuf and gRPC code from proto/timeshard/v1 into gen/ (committed, never
# edited by hand).
#
#   clients/go/generate.sh           # write gen/timeshard/v1/*.go
#   clients/go/generate.sh --check   # exit 1 if the committed code differs (drift)
#
# protoc is grpcio-tools' (python -m grpc_tools.protoc); the two Go plugins are installed at
# the pinned versions below into clients/go/.tools (ignored by git).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.0
MODULE=github.com/timeshard/timeshard/clients/go
PYTHON="${PYTHON:-python3}"

tools="$here/.tools"
mkdir -p "$tools"
install_plugin() { # name module version
  local stamp="$tools/$1.version"
  if [[ ! -x "$tools/$1" || "$(cat "$stamp" 2>/dev/null)" != "$3" ]]; then
    GOBIN="$tools" GOFLAGS=-mod=mod go install "$2@$3"
    echo "$3" >"$stamp"
  fi
}
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC"

well_known="$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"

generate() { # into
  local into="$1" protos mapping=()
  mkdir -p "$into"
  mapfile -t protos < <(cd "$root/proto" && find timeshard -name '*.proto' | sort)
  # The proto's own go_package names no module of ours: map each file to this module's gen/.
  for p in "${protos[@]}"; do
    mapping+=("M$p=$MODULE/gen/$(dirname "$p");$(basename "$(dirname "$(dirname "$p")")")$(basename "$(dirname "$p")")")
  done
  local go_opts="paths=source_relative" grpc_opts="paths=source_relative"
  for m in "${mapping[@]}"; do go_opts+=",$m"; grpc_opts+=",$m"; done
  (cd "$root/proto" && "$PYTHON" -m grpc_tools.protoc -I. "-I$well_known" \
    "--plugin=protoc-gen-go=$tools/protoc-gen-go" \
    "--plugin=protoc-gen-go-grpc=$tools/protoc-gen-go-grpc" \
    "--go_out=$into" "--go_opt=$go_opts" \
    "--go-grpc_out=$into" "--go-grpc_opt=$grpc_opts" \
    "${protos[@]}")
}

if [[ "${1:-}" == "--check" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r "$tmp" "$here/gen" >/dev/null; then
    diff -r "$tmp" "$here/gen" | head -40 >&2 || true
    echo "clients/go/gen differs from proto/: run clients/go/generate.sh and commit" >&2
    exit 1
  fi
  echo "clients/go/gen is up to date"
elif [[ -z "${1:-}" ]]; then
  rm -rf "$here/gen"
  generate "$here/gen"
  echo "wrote $here/gen"
else
  echo "usage: $0 [--check]" >&2
  exit 2
fi
