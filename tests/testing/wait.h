// WaitUntil: how a test waits for another thread or process, instead of
// sleeping for a guessed time.
//
// Contract: polls `pred`, a read of observable state (a counter, a log, a
// file, an RPC's answer), until it returns true or `timeout` has passed on
// the monotonic clock (steady_clock: a stepped wall clock neither cuts the
// wait short nor stretches it). Returns whether `pred` held: true as soon
// as it does, false once it was still false at or after the deadline.
// `pred` runs on the calling thread, at least once, every few milliseconds;
// it must not block for long (it is not interrupted at the deadline).
#ifndef GRADSYNC_TESTS_TESTING_WAIT_H_
#define GRADSYNC_TESTS_TESTING_WAIT_H_

#include <chrono>
#include <functional>

#include "absl/time/time.h"

namespace gradsync::testing {

bool WaitUntil(const std::function<bool()>& pred, std::chrono::nanoseconds timeout);

inline bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout) {
  return WaitUntil(pred, absl::ToChronoNanoseconds(timeout));
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_WAIT_H_
