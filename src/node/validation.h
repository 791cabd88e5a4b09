// The result of validating a node's GPU stack: ordered steps (driver, runtime, device plugin), each
// passed or failed with a one-line reason. Plain values.
#pragma once

#include <string>
#include <vector>

namespace gpulet::node {

struct StepResult {
  std::string name;  // "driver", "runtime", "device-plugin"
  bool ok = false;
  std::string detail;  // what was found, or what is wrong and what to check
};

struct ValidationReport {
  std::vector<StepResult> steps;
  bool ok() const {
    if (steps.empty()) return false;
    for (const auto& s : steps)
      if (!s.ok) return false;
    return true;
  }
  // Every step's "name: detail", in order: what a passed validation was judged on.
  std::string Summary() const {
    std::string out;
    for (const auto& s : steps) out += (out.empty() ? "" : "; ") + s.name + ": " + s.detail;
    return out;
  }
  // First failing step's "name: detail", or "" when all passed.
  std::string FirstFailure() const {
    for (const auto& s : steps)
      if (!s.ok) return s.name + ": " + s.detail;
    return "";
  }
};

}  // namespace gpulet::node
