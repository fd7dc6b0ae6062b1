// ValidateReadyEvent: every field of a readiness entry is checked, and a
// failure names the field with the value seen and the value expected.
#include "ipc/events.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync::ipc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr ReadyExpectation kExpect = {/*num_tensors=*/10, /*iteration=*/7, /*sequence=*/42};

ReadyEvent Good() {
  ReadyEvent e{};
  e.tensor = 3;
  e.kind = static_cast<uint32_t>(ReadyKind::kReady);
  e.iteration = 7;
  e.sequence = 42;
  return e;
}

TEST(ValidateReadyEventTest, AcceptsReadyAndUnused) {
  EXPECT_TRUE(ValidateReadyEvent(Good(), kExpect).ok());
  ReadyEvent e = Good();
  e.kind = static_cast<uint32_t>(ReadyKind::kUnused);
  EXPECT_TRUE(ValidateReadyEvent(e, kExpect).ok());
}

TEST(ValidateReadyEventTest, AcceptsFirstAndLastTensor) {
  ReadyEvent e = Good();
  e.tensor = 0;
  EXPECT_TRUE(ValidateReadyEvent(e, kExpect).ok());
  e.tensor = 9;
  EXPECT_TRUE(ValidateReadyEvent(e, kExpect).ok());
}

TEST(ValidateReadyEventTest, SequenceGapIsDataLoss) {
  ReadyEvent e = Good();
  e.sequence = 43;  // entry 42 was lost
  const absl::Status st = ValidateReadyEvent(e, kExpect);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("sequence 43"), HasSubstr("expected 42")));
}

TEST(ValidateReadyEventTest, RepeatedSequenceIsDataLoss) {
  ReadyEvent e = Good();
  e.sequence = 41;  // entry 41 delivered twice
  const absl::Status st = ValidateReadyEvent(e, kExpect);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("sequence 41"), HasSubstr("expected 42")));
}

TEST(ValidateReadyEventTest, UnknownKindIsDataLoss) {
  for (uint32_t kind : {0u, 4u, 0xffffu}) {
    ReadyEvent e = Good();
    e.kind = kind;
    const absl::Status st = ValidateReadyEvent(e, kExpect);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << kind;
    EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("unknown kind ", kind)));
  }
}

// A CUDA mark names one of the trainer's pooled events; a CPU trainer has
// none, so any slot but 0 is refused for it.
TEST(ValidateReadyEventTest, EventSlotMustBeInTheTrainersPool) {
  ReadyEvent e = Good();
  ReadyExpectation cuda = kExpect;
  cuda.event_slots = 256;
  e.event_slot = 255;
  EXPECT_TRUE(ValidateReadyEvent(e, cuda).ok());
  e.event_slot = 256;
  absl::Status st = ValidateReadyEvent(e, cuda);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("event slot 256 of 256"));
  e.event_slot = 1;
  st = ValidateReadyEvent(e, kExpect);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("event slot 1 of 0"));
}

// A join entry (gs_join) carries flags, not a tensor index: only the known
// flag passes, whatever the layout's size.
TEST(ValidateReadyEventTest, JoinCarriesFlagsNotATensor) {
  ReadyEvent e = Good();
  e.kind = static_cast<uint32_t>(ReadyKind::kJoin);
  for (uint32_t flags : {0u, kJoinDivideByInitialWorldSize}) {
    e.tensor = flags;
    EXPECT_TRUE(ValidateReadyEvent(e, ReadyExpectation{0, 7, 42}).ok()) << flags;
  }
  e.tensor = 2;
  const absl::Status st = ValidateReadyEvent(e, kExpect);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("readiness entry of kind join has unknown flags 2"));
}

TEST(ValidateReadyEventTest, TensorOutOfRange) {
  for (uint32_t tensor : {10u, 11u, 0xffffffffu}) {
    ReadyEvent e = Good();
    e.tensor = tensor;
    const absl::Status st = ValidateReadyEvent(e, kExpect);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << tensor;
    EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("tensor ", tensor, " of 10")));
  }
}

TEST(ValidateReadyEventTest, WrongIterationIsDataLoss) {
  for (uint64_t iteration : {uint64_t{6}, uint64_t{8}}) {
    ReadyEvent e = Good();
    e.iteration = iteration;
    const absl::Status st = ValidateReadyEvent(e, kExpect);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(st.message(),
                AllOf(HasSubstr(absl::StrCat("iteration ", iteration)), HasSubstr("expected 7")));
  }
}

TEST(ValidateReadyEventTest, NoTensorsMeansEveryEntryIsOutOfRange) {
  ReadyEvent e = Good();
  e.tensor = 0;
  EXPECT_EQ(ValidateReadyEvent(e, {0, 7, 42}).code(), absl::StatusCode::kOutOfRange);
}

TEST(EventsTest, EntriesAreFixedSize) {
  // Both processes must agree on the slot size whatever the compiler.
  EXPECT_EQ(sizeof(ReadyEvent), 32u);
  EXPECT_EQ(sizeof(CompletionEvent), 32u);
}

}  // namespace
}  // namespace gradsync::ipc
