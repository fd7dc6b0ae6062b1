// RETURN_IF_ERROR / ASSIGN_OR_RETURN: the early return every absl::Status
// ladder spells out by hand, written once.
//
//   RETURN_IF_ERROR(Open(path));          // returns Open's error as it is
//   ASSIGN_OR_RETURN(Segment seg, Map(path));  // declares `seg`, or returns
//   ASSIGN_OR_RETURN(node_, Create());     // assigns an existing variable
//
// Usable in any function returning absl::Status or absl::StatusOr<T>. The
// error passes through unchanged (code, message, payloads): where the caller
// must add context (which flag, which file), keep the hand-written form.
// ASSIGN_OR_RETURN expands to several statements, so it cannot be the lone
// body of an unbraced if/else, and its `lhs` may not contain a top-level
// comma (write `auto [a, b]` or use a type alias).
#ifndef GRADSYNC_COMMON_STATUS_MACROS_H_
#define GRADSYNC_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once; returns it if it is an error.
#define RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                \
    if (::absl::Status gradsync_status_macro_ = (expr); !gradsync_status_macro_.ok()) \
      return gradsync_status_macro_;                                                  \
  } while (false)

// Evaluates `expr` (an absl::StatusOr<T>) once; returns its status if it is an
// error, else moves its value into `lhs`.
#define ASSIGN_OR_RETURN(lhs, expr)                                                             \
  GRADSYNC_ASSIGN_OR_RETURN_IMPL_(GRADSYNC_STATUS_MACROS_CONCAT_(gradsync_statusor_, __LINE__), \
                                  lhs, expr)

// Implementation details.
#define GRADSYNC_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define GRADSYNC_STATUS_MACROS_CONCAT_(a, b) GRADSYNC_STATUS_MACROS_CONCAT_INNER_(a, b)
#define GRADSYNC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)

#endif  // GRADSYNC_COMMON_STATUS_MACROS_H_
