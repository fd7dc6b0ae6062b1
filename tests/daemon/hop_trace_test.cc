// The hop trace hop_report.py reads: $GRADSYNC_HOP_TRACE=DIR makes each
// process write DIR/hops.<pid>.tsv, one "hop<TAB>node<TAB>ns" line per
// record, in the order recorded, on the monotonic clock.
#include "common/hop_trace.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/monotonic.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(HopTrace, RecordsEachHopWithItsNodeInOrderIntoTheDirectoryTheEnvironmentNames) {
  char dir[] = "/tmp/gshoptestXXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Read once, at the first record: set before any.
  ASSERT_EQ(setenv("GRADSYNC_HOP_TRACE", dir, 1), 0);
  ASSERT_TRUE(HopTraceEnabled());
  const int64_t before = MonotonicNowNs();
  RecordHop(Hop::kTrainerMark, 0);
  RecordHop(Hop::kWorkerGlooStart, 1);
  RecordHop(Hop::kTrainerWoken, -1);
  const int64_t after = MonotonicNowNs();
  FlushHopTrace();

  std::ifstream file(absl::StrCat(dir, "/hops.", getpid(), ".tsv"));
  ASSERT_TRUE(file.is_open());
  std::vector<std::vector<std::string>> lines;
  for (std::string line; std::getline(file, line);) {
    lines.push_back(absl::StrSplit(line, '\t'));
  }
  ASSERT_EQ(lines.size(), 3u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"trainer_mark", "0"}, {"worker_gloo_start", "1"}, {"trainer_woken", "-1"}};
  int64_t previous = before;
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].size(), 3u) << i;
    EXPECT_EQ(lines[i][0], expected[i].first);
    EXPECT_EQ(lines[i][1], expected[i].second);
    int64_t ns = 0;
    ASSERT_TRUE(absl::SimpleAtoi(lines[i][2], &ns)) << lines[i][2];
    EXPECT_GE(ns, previous);
    EXPECT_LE(ns, after);
    previous = ns;
  }
  // Flushed records are not written twice.
  FlushHopTrace();
  std::ifstream again(absl::StrCat(dir, "/hops.", getpid(), ".tsv"));
  int count = 0;
  for (std::string line; std::getline(again, line);) ++count;
  EXPECT_EQ(count, 3);
}

}  // namespace
}  // namespace gradsync
