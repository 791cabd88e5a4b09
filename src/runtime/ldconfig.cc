#include "runtime/ldconfig.h"

#include <elf.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace gpulet::runtime {
namespace {

bool ReadAt(int fd, void* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r =
        ::pread(fd, static_cast<char*>(buf) + done, n - done, off + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// Walks the program headers of an ELF of class `Ehdr`/`Phdr`; true when one is PT_INTERP.
template <typename Ehdr, typename Phdr>
absl::StatusOr<bool> HasInterp(int fd, const std::string& what) {
  Ehdr eh;
  if (!ReadAt(fd, &eh, sizeof eh, 0))
    return absl::FailedPreconditionError(absl::StrCat(what, ": truncated ELF header"));
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)
    return absl::FailedPreconditionError(absl::StrCat(what, ": not an ELF executable"));
  if (eh.e_phentsize != sizeof(Phdr) || eh.e_phnum == 0 || eh.e_phnum > 4096)
    return absl::FailedPreconditionError(absl::StrCat(what, ": malformed ELF program headers"));
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    Phdr ph;
    if (!ReadAt(fd, &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof(Phdr))))
      return absl::FailedPreconditionError(absl::StrCat(what, ": truncated ELF program headers"));
    if (ph.p_type == PT_INTERP) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> LdconfigCandidates(const std::string& configured) {
  if (configured.empty())
    return {"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig.real",
            "/usr/sbin/ldconfig"};
  return {configured + ".real", configured};
}

absl::Status CheckStaticElf(int fd, const std::string& what) {
  unsigned char id[EI_NIDENT] = {};
  if (!ReadAt(fd, id, 2, 0))
    return absl::FailedPreconditionError(absl::StrCat(what, ": empty or unreadable"));
  if (id[0] == '#' && id[1] == '!')
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     " is a script (#!): run chrooted in the container it would start the image's "
                     "interpreter; set \"ldconfig\" to the static ELF binary it wraps"));
  if (!ReadAt(fd, id, sizeof id, 0) || std::memcmp(id, ELFMAG, SELFMAG) != 0)
    return absl::FailedPreconditionError(absl::StrCat(what, ": not an ELF executable"));
  absl::StatusOr<bool> interp =
      id[EI_CLASS] == ELFCLASS64 ? HasInterp<Elf64_Ehdr, Elf64_Phdr>(fd, what)
      : id[EI_CLASS] == ELFCLASS32
          ? HasInterp<Elf32_Ehdr, Elf32_Phdr>(fd, what)
          : absl::FailedPreconditionError(absl::StrCat(what, ": unknown ELF class"));
  if (!interp.ok()) return interp.status();
  if (*interp)
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        " is dynamically linked (PT_INTERP): run chrooted in the container it would load "
        "the image's ld.so and libc as host root; use a statically linked ldconfig"));
  return absl::OkStatus();
}

absl::StatusOr<Ldconfig> OpenLdconfig(const std::string& configured, const std::string& root) {
  std::string prefix(absl::StripSuffix(root, "/"));
  std::vector<std::string> tried;
  for (const auto& c : LdconfigCandidates(configured)) {
    std::string path = prefix + c;
    tried.push_back(path);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT || errno == ENOTDIR) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open ldconfig ", path, ": ", std::strerror(errno)));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0)
      return absl::FailedPreconditionError(
          absl::StrCat("ldconfig ", path, " is not an executable regular file"));
    absl::Status s = CheckStaticElf(fd.get(), "ldconfig " + path);
    if (!s.ok()) return s;
    return Ldconfig{path, std::move(fd)};
  }
  return absl::NotFoundError(
      absl::StrCat("no host ldconfig (tried ", absl::StrJoin(tried, ", "), ")"));
}

absl::Status DropCapabilitiesForLdconfig() {
  constexpr int kKeep[] = {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH};
  auto keep = [&](int cap) {
    for (int k : kKeep)
      if (k == cap) return true;
    return false;
  };
  // The bounding set first (dropping it needs CAP_SETPCAP, which goes below): root's exec
  // recomputes the permitted set from the bounding set, so capset alone would be undone.
  for (int cap = 0; cap <= 63; ++cap) {
    if (keep(cap)) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      return absl::InternalError(absl::StrCat("cannot drop capability ", cap,
                                              " from the bounding set: ", std::strerror(errno)));
    }
  }
  (void)::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  for (int k : kKeep) {
    data[k / 32].effective |= 1u << (k % 32);
    data[k / 32].permitted |= 1u << (k % 32);
  }
  if (::syscall(SYS_capset, &hdr, data) != 0)
    return absl::InternalError(absl::StrCat("cannot drop capabilities: ", std::strerror(errno)));
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return absl::InternalError(absl::StrCat("cannot set no_new_privs: ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace gpulet::runtime
