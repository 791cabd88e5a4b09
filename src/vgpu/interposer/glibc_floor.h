// The interposer is preloaded into whatever image a tenant brings, and that image's glibc may be
// older than the one it is built with (Debian 12: 2.36). Ubuntu 20.04 and Debian 11 images have
// 2.31, UBI 8 2.28, CentOS 7 2.17. glibc 2.34 moved dlopen & co and the pthread functions into
// libc.so.6 under a new symbol version, GLIBC_2.34, and kept the old versions there; a library
// linked against the new ones does not load on an older glibc: the loader refuses the preload and
// the container's programs do not start (Debian 11's libc6 2.31: "version `GLIBC_2.34' not found
// (required by libgpulet-vcuda.so)"). So every reference below binds to the oldest version, which
// glibc 2.17 to 2.33 define in libdl.so.2 and libpthread.so.0 (the library names both as NEEDED:
// CMakeLists.txt) and newer glibc in libc.so.6. Included by every file of the library that calls
// them (anywhere in the file: .symver acts on the object file). tests/vgpu/interposer/
// glibc_floor_test.sh checks that nothing newer than GLIBC_2.17 is needed and that the library
// works in programs of Debian 11's glibc.
#pragma once

#if defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
__asm__(".symver dladdr1,dladdr1@GLIBC_2.3.3");
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@GLIBC_2.2.5");
// The slot locks (abi/vgpu_accounting.h); glibc 2.28 added fcntl64, which LFS builds would bind to.
__asm__(".symver fcntl,fcntl@GLIBC_2.2.5");
#endif
