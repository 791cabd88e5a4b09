// Status helpers shared by every module. Module boundaries return absl::Status / absl::StatusOr;
// these macros keep the happy path readable.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GPULET_CONCAT_INNER_(a, b) a##b
#define GPULET_CONCAT_(a, b) GPULET_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status gpulet_status_ = (expr);          \
    if (!gpulet_status_.ok()) return gpulet_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, FnReturningStatusOr())`: binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(GPULET_CONCAT_(gpulet_statusor_, __LINE__), lhs, expr)
// `tmp` and `lhs` are declarations, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)   \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
