// RETURN_IF_ERROR and ASSIGN_OR_RETURN: an error returns at once, unchanged
// (code, message, payload), nothing after it runs, and the expression is
// evaluated exactly once; success falls through with the value moved out.
#include "common/status_macros.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

// Counts its calls, so a macro that evaluates its argument twice shows up.
struct Source {
  int calls = 0;
  absl::Status status = absl::OkStatus();
  absl::Status Check() {
    ++calls;
    return status;
  }
  absl::StatusOr<std::unique_ptr<int>> Make(int value) {
    ++calls;
    if (!status.ok()) return status;
    return std::make_unique<int>(value);
  }
};

absl::Status CheckThenMark(Source& source, bool* reached_after) {
  RETURN_IF_ERROR(source.Check());
  *reached_after = true;
  return absl::OkStatus();
}

absl::StatusOr<int> MakeTwice(Source& source, bool* reached_after) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> first, source.Make(20));
  std::unique_ptr<int> second;
  ASSIGN_OR_RETURN(second, source.Make(22));  // an existing variable
  *reached_after = true;
  return *first + *second;
}

TEST(StatusMacrosTest, ReturnIfErrorPassesTheErrorThroughAndStopsThere) {
  Source source;
  source.status = absl::NotFoundError("segment gs-node1 is gone");
  source.status.SetPayload("gradsync.test", absl::Cord("kept"));
  bool reached_after = false;
  const absl::Status st = CheckThenMark(source, &reached_after);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "segment gs-node1 is gone");
  EXPECT_EQ(st.GetPayload("gradsync.test"), absl::Cord("kept"));
  EXPECT_FALSE(reached_after);
  EXPECT_EQ(source.calls, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorFallsThroughOnOk) {
  Source source;
  bool reached_after = false;
  EXPECT_TRUE(CheckThenMark(source, &reached_after).ok());
  EXPECT_TRUE(reached_after);
  EXPECT_EQ(source.calls, 1);
}

TEST(StatusMacrosTest, AssignOrReturnMovesTheValueOutOnOk) {
  Source source;
  bool reached_after = false;
  const absl::StatusOr<int> sum = MakeTwice(source, &reached_after);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 42);
  EXPECT_TRUE(reached_after);
  EXPECT_EQ(source.calls, 2);
}

TEST(StatusMacrosTest, AssignOrReturnReturnsTheFirstErrorUnchanged) {
  Source source;
  source.status = absl::ResourceExhaustedError("no room for bucket 3");
  bool reached_after = false;
  const absl::StatusOr<int> sum = MakeTwice(source, &reached_after);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sum.status().message(), "no room for bucket 3");
  EXPECT_FALSE(reached_after);
  EXPECT_EQ(source.calls, 1);  // the second Make never ran
}

// The if/else a do-while(false) wrapper keeps intact: without it, the
// `else` would bind to the macro's own `if`.
absl::Status ReturnIfErrorInUnbracedIf(bool check, Source& source, int* branch) {
  if (check)
    RETURN_IF_ERROR(source.Check());
  else
    *branch = 2;
  if (*branch == 0) *branch = 1;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorIsOneStatement) {
  Source source;
  int branch = 0;
  ASSERT_TRUE(ReturnIfErrorInUnbracedIf(false, source, &branch).ok());
  EXPECT_EQ(branch, 2);
  EXPECT_EQ(source.calls, 0);
  branch = 0;
  ASSERT_TRUE(ReturnIfErrorInUnbracedIf(true, source, &branch).ok());
  EXPECT_EQ(branch, 1);
  EXPECT_EQ(source.calls, 1);
}

}  // namespace
}  // namespace gradsync
