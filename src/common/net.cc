#include "common/net.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpulet {
namespace {

// The words for a bind errno, with what usually causes it.
std::string BindReason(int err, bool unix_socket) {
  switch (err) {
    case EADDRINUSE:
      return "address in use (another process listens there)";
    case EACCES:
    case EPERM:
      return unix_socket ? "no permission to create the socket in its directory"
                         : "no permission (ports below 1024 need root or CAP_NET_BIND_SERVICE)";
    case EADDRNOTAVAIL:
      return "no such address on this host";
    case ENOENT:
    case ENOTDIR:
      return "no such directory";
    default:
      return std::strerror(err);
  }
}

}  // namespace

absl::Status ProbeTcpListen(const std::string& host, int port) {
  const std::string where = absl::StrCat(host, ":", port);
  std::string name = host;  // "[::1]" as written in a listen address
  if (name.size() > 2 && name.front() == '[' && name.back() == ']')
    name = name.substr(1, name.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(name.empty() ? nullptr : name.c_str(), service.c_str(), &hints, &res);
      rc != 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", where, ": no such address (", gai_strerror(rc), ")"));
  int err = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int yes = 1;  // as the servers set it: a socket in TIME_WAIT is no conflict
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    err = rc == 0 ? 0 : errno;
    ::close(fd);
    if (rc == 0) break;
  }
  ::freeaddrinfo(res);
  if (err == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("cannot listen on ", where, ": ", BindReason(err, false)));
}

absl::Status TcpListenFailed(const std::string& host, int port) {
  absl::Status why = ProbeTcpListen(host, port);
  return absl::UnavailableError(why.ok() ? absl::StrCat("cannot listen on ", host, ":", port)
                                         : std::string(why.message()));
}

absl::Status ProbeUnixListen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return absl::InvalidArgumentError(absl::StrCat("cannot serve on ", path, ": the path is over ",
                                                   sizeof addr.sun_path - 1, " bytes"));
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  if (rc == 0) {
    ::unlink(path.c_str());
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot serve on ", path, ": ", BindReason(err, true)));
}

}  // namespace gpulet
