#!/usr/bin/env bash
# The interposer loads into images built on an older glibc than ours (src/vgpu/interposer/
# glibc_floor.h). Before session 9 it needed GLIBC_2.33 and GLIBC_2.34, and Debian 11's glibc 2.31
# refused the preload: "version `GLIBC_2.34' not found (required by libgpulet-vcuda.so)".
#  1. no symbol version newer than GLIBC_2.17 (CentOS 7's glibc) is needed;
#  2. libdl.so.2 and libpthread.so.0 are NEEDED (where glibc before 2.34 defines dlopen & co);
#  3. preloaded with every symbol bound at once (LD_BIND_NOW) into getconf of Debian 11's glibc
#     2.31 (testing/glibc/get), run by that glibc's loader, the program runs;
#  4. a program and a stand-in CUDA driver built against that glibc (old_glibc/): under a 64 MiB
#     limit the interposer refuses the second 48 MiB allocation and shows 64 MiB in all (without
#     it both succeed).
# Usage: glibc_floor_test.sh LIBRARY SOURCE_DIR BUILD_DIR
set -u
lib=$1 src=$2 build=$3
fail=0
check() { if "${@:2}"; then echo "ok:   $1"; else echo "FAIL: $1"; fail=1; fi; }
[[ -f $lib ]] || { echo "skipped: $lib not built"; exit 77; }
command -v objdump >/dev/null || { echo "skipped: no objdump (binutils)"; exit 77; }
newest=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
check "the newest glibc symbol version needed is $newest (at most GLIBC_2.17)" \
  bash -c '[ "$(printf "%s\n" "$1" GLIBC_2.17 | sort -V | tail -n 1)" = GLIBC_2.17 ]' _ "$newest"
needed=$(objdump -p "$lib" | awk '$1 == "NEEDED" { print $2 }' | tr '\n' ' ')
check "NEEDED: libdl.so.2 and libpthread.so.0 ($needed)" \
  bash -c '[[ " $1" == *" libdl.so.2 "* && " $1" == *" libpthread.so.0 "* ]]' _ "$needed"
if old=$("$src/testing/glibc/get" "$build" 2>"$build/glibc-get.log"); then
  ld=$old/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  out=$(LD_BIND_NOW=1 LD_PRELOAD=$lib "$ld" --library-path "$old/lib/x86_64-linux-gnu" "$old/usr/bin/getconf" PAGESIZE 2>&1)
  check "preloaded into Debian 11's getconf (glibc $(cd "$old/lib/x86_64-linux-gnu" && ls libc-*.so | sed 's/libc-\(.*\)\.so/\1/')), it runs (output: $out)" \
    bash -c '[[ $1 =~ ^[0-9]+$ ]]' _ "$out"
  t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
  cc_old() { cc --sysroot="$old" -B"$old/usr/lib/x86_64-linux-gnu/" "$@"; }
  if cc_old -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$t/libcuda.so.1" "$src/tests/vgpu/interposer/old_glibc/cuda_stub.c" &&
     cc_old -o "$t/alloc" "$src/tests/vgpu/interposer/old_glibc/alloc.c" -ldl; then
    run_old=("$ld" --library-path "$old/lib/x86_64-linux-gnu:$t" "$t/alloc")
    out=$("${run_old[@]}" 48 2 2>&1)
    check "without the interposer both 48 MiB allocations succeed ($out)" grep -qx "held 96 refused - total 81920" <<< "$out"
    out=$(env LD_PRELOAD="$lib" GPULET_VGPU_MEMORY_LIMIT=67108864 GPULET_VGPU_CONTEXT_BYTES=0 \
          GPULET_VGPU_ACCOUNTING="$t/accounting" "${run_old[@]}" 48 2 2>&1)
    check "with it, under 64 MiB on glibc 2.31: the second is refused (2, out of memory), 64 MiB in all ($out)" \
      grep -qx "held 48 refused 2 total 64" <<< "$out"
  else
    echo "FAIL: cannot build the glibc 2.31 programs with cc --sysroot=$old"; fail=1
  fi
else
  echo "not run: the older glibc could not be fetched ($(tail -n 1 "$build/glibc-get.log")): only the symbol checks ran"
fi
exit $fail
