// Which host ldconfig the hook runs for a container, decided once for the hook and for
// `gpulet validate`'s runtime config. The hook runs it as host root chrooted into the image's
// rootfs, so only a statically linked ELF is acceptable: a `#!` script would run the image's
// interpreter (Ubuntu's /sbin/ldconfig is a /bin/sh wrapper around /sbin/ldconfig.real), and a
// dynamically linked ELF (PT_INTERP) would load the image's ld.so and libc as host root.
// Plain functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/rootfs.h"

namespace gpulet::runtime {

// The candidates, in order, for a configured ldconfig (host path; empty: the default):
// configured: "<configured>.real", "<configured>";
// default: /sbin/ldconfig.real, /sbin/ldconfig, /usr/sbin/ldconfig.real, /usr/sbin/ldconfig.
// `.real` first, as NVIDIA's toolkit does: on Ubuntu it is the binary the wrapper runs.
std::vector<std::string> LdconfigCandidates(const std::string& configured);

// Checks that the open file is a statically linked ELF executable (ELF magic, ET_EXEC or ET_DYN,
// no PT_INTERP program header). `what` names the file in the error. Reads through pread: the
// caller execs this very fd afterwards, so what was checked is what runs.
absl::Status CheckStaticElf(int fd, const std::string& what);

struct Ldconfig {
  std::string path;  // as opened (with `root` prefixed)
  Fd fd;             // O_RDONLY|O_CLOEXEC, checked: fexecve() it
};

// Opens the first existing candidate under `root` ("" or "/": this process's root; the host
// root mounted elsewhere for `gpulet validate`) and checks it. A `#!` script falls through to
// the next candidate only as its own `.real` (already tried first); any other failure of an
// existing candidate is the error, naming the file and why. None existing: NotFound naming all.
absl::StatusOr<Ldconfig> OpenLdconfig(const std::string& configured, const std::string& root = "");

// The capabilities ldconfig keeps (everything else is dropped from the bounding, permitted,
// effective and inheritable sets before exec, with no_new_privs): it writes
// /etc/ld.so.cache and the soname links of the folders it is given, in an image whose files may
// belong to other users (user-namespaced or rootless images), so CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH; it does not chown, mknod, mount or chroot (the chroot is done before).
// Returns the error of the first call that fails. Process-wide: call in the child before exec.
absl::Status DropCapabilitiesForLdconfig();

}  // namespace gpulet::runtime
