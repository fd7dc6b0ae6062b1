// What every trainer of a job that a non-finite gradient failed
// (--nonfinite=error) must show: exit INVALID_ARGUMENT, its error naming
// the culprit trainer (rank, local rank, pid, node), the tensor, the
// element and its value.
#ifndef GRADSYNC_TESTS_INTEGRATION_NONFINITE_CULPRIT_H_
#define GRADSYNC_TESTS_INTEGRATION_NONFINITE_CULPRIT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/testing/process.h"

namespace gradsync::testing {

// How the culprit's own node names it: the trainer, its pid and its node
// (the host follows, which the tests do not pin).
std::string NonFiniteCulprit(int rank, int local_rank, const Process& trainer, int node);

// The element the culprit wrote: "tensor 0 'fc1.weight' element 5 = nan".
std::string NonFiniteElement(int tensor, const std::string& name, uint64_t element,
                             const std::string& value);

// Waits for each of `trainers` (up to `bound`) and expects it to exit
// INVALID_ARGUMENT with every text of `named` in its log; no trainers is a
// failure too. `daemon_logs` is read after a trainer's wait, so a failure
// shows what the daemons said by then. Every trainer's log, in order, for
// the caller's own checks.
std::vector<std::string> ExpectEveryTrainerFailsNaming(
    std::vector<Process>& trainers, const std::vector<std::string>& named,
    std::chrono::milliseconds bound, const std::function<std::string()>& daemon_logs);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_NONFINITE_CULPRIT_H_
