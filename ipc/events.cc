#include "ipc/events.h"

#include "absl/strings/str_cat.h"

namespace gradsync::ipc {

absl::Status ValidateReadyEvent(const ReadyEvent& e, const ReadyExpectation& expect) {
  if (e.sequence != expect.sequence) {
    return absl::DataLossError(
        absl::StrCat("readiness entry has sequence ", e.sequence, ", expected ", expect.sequence));
  }
  if (e.kind != static_cast<uint32_t>(ReadyKind::kReady) &&
      e.kind != static_cast<uint32_t>(ReadyKind::kUnused) &&
      e.kind != static_cast<uint32_t>(ReadyKind::kJoin)) {
    return absl::DataLossError(absl::StrCat("readiness entry has unknown kind ", e.kind));
  }
  if (e.kind == static_cast<uint32_t>(ReadyKind::kJoin)) {
    if ((e.tensor & ~kJoinDivideByInitialWorldSize) != 0) {
      return absl::DataLossError(
          absl::StrCat("readiness entry of kind join has unknown flags ", e.tensor));
    }
  } else if (e.tensor >= expect.num_tensors) {
    return absl::OutOfRangeError(
        absl::StrCat("readiness entry names tensor ", e.tensor, " of ", expect.num_tensors));
  }
  if (e.event_slot != 0 && e.event_slot >= expect.event_slots) {
    return absl::OutOfRangeError(absl::StrCat("readiness entry names event slot ", e.event_slot,
                                              " of ", expect.event_slots));
  }
  if (e.iteration != expect.iteration) {
    return absl::DataLossError(absl::StrCat("readiness entry is for iteration ", e.iteration,
                                            ", expected ", expect.iteration));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::ipc
