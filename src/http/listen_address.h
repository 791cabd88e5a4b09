// The one parser of listen addresses, for every server gpulet runs (exporter, extender, webhook,
// health): "host:port", ":port" (every IPv4 address) or "[ipv6]:port".
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"

namespace gpulet::http {

// -> (host, port); host "0.0.0.0" for ":port", without brackets for "[::1]:port"; port 0..65535.
// InvalidArgument quoting the address and what is wrong with it.
absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(std::string_view address);

// Whether `host` (as ParseListenAddress returns it) is this machine's loopback only.
bool IsLoopbackHost(std::string_view host);

}  // namespace gpulet::http
