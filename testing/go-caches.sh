# Sourced (POSIX sh) by the scripts that build Go test peers (testing/k8s/build,
# testing/nvidia/build): where Go's build and module caches go, and a record of that choice.
#   1. GPULET_GOCACHE=DIR: DIR/build and DIR/mod, to share one cache between build trees;
#   2. else GOCACHE / GOMODCACHE, each one the user has set (in the environment or with
#      `go env -w`; `go env -changed` tells which);
#   3. else BUILD/gocache/build and BUILD/gocache/mod: inside the build tree, one cache for every
#      peer, gone with `make clean`.
# The choice is written to RECORD (GOCACHE=... and GOMODCACHE=... lines; BUILD/<peer>/go-caches),
# which tests that read the module cache (tests/compat/nvml_symbols.sh) read, so they look in the
# cache the build really used. -modcacherw keeps the module cache removable by rm -rf without root.
gpulet_go_caches() { # BUILD (absolute) RECORD
  if [ -n "${GPULET_GOCACHE:-}" ]; then
    GOCACHE=$GPULET_GOCACHE/build
    GOMODCACHE=$GPULET_GOCACHE/mod
  else
    _changed=$(go env -changed GOCACHE GOMODCACHE 2>/dev/null || true)
    case $_changed in *GOCACHE=*) GOCACHE=$(go env GOCACHE) ;; *) GOCACHE=$1/gocache/build ;; esac
    case $_changed in *GOMODCACHE=*) GOMODCACHE=$(go env GOMODCACHE) ;; *) GOMODCACHE=$1/gocache/mod ;; esac
  fi
  export GOCACHE GOMODCACHE
  export GOFLAGS="-mod=readonly -buildvcs=false -modcacherw"
  mkdir -p "$GOCACHE" "$GOMODCACHE"
  printf 'GOCACHE=%s\nGOMODCACHE=%s\n' "$GOCACHE" "$GOMODCACHE" >"$2"
}
