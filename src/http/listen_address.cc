#include "http/listen_address.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpulet::http {

absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(std::string_view saddr) {
  absl::string_view address(saddr.data(), saddr.size()), host, port;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", address, "': expected [ipv6]:port"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", address, "': expected host:port or :port"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "': port '", port, "' is not 0..65535"));
  }
  return std::make_pair(host.empty() ? std::string("0.0.0.0") : std::string(host), p);
}

bool IsLoopbackHost(std::string_view h) {
  absl::string_view host(h.data(), h.size());
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace gpulet::http
