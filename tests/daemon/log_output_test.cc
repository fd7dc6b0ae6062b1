// --log-format: key=value log lines as JSON lines or systemd
// journal fields, with user-given values (tensor names holding quotes,
// newlines and '=') escaped by LogValue and carried through intact.
//
// The journal itself cannot be read back on the build machine (no journald:
// `journalctl` finds no journal files), so the journal output is tested
// through the fields it sends (JournalFields); the JSON output both through
// the formatter and through a real gradsyncd's stderr.
#include "daemon/log_output.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/log_fields.h"
#include "common/log_value.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using json = nlohmann::json;

const std::string kNastyName = "layer\"0\".w=1\nx\\y";

TEST(LogFieldsTest, PlainAndQuotedValuesRoundTripLogValue) {
  const std::string line =
      "event=tensor_refused job=default tensor=" + LogValue(kNastyName) + " bytes=12";
  EXPECT_THAT(ParseLogFields(line),
              ElementsAre(Pair("event", "tensor_refused"), Pair("job", "default"),
                          Pair("tensor", kNastyName), Pair("bytes", "12")));
}

TEST(LogFieldsTest, FreeTextIsKeptUnderMessage) {
  EXPECT_THAT(ParseLogFields("event=x then some words"),
              ElementsAre(Pair("event", "x"), Pair("message", "then some words")));
  EXPECT_THAT(ParseLogFields("error=\"unterminated"),
              ElementsAre(Pair("message", "error=\"unterminated")));
}

TEST(LogOutputTest, JsonFormatterWritesOneObjectPerLineWithTheFieldsAsKeys) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger->set_formatter(std::make_unique<JsonLogFormatter>("gradsyncd"));
  logger->warn("event=tensor_refused job=default tensor={} bytes={}", LogValue(kNastyName), 12);
  logger->info("event=started");

  const std::vector<std::string> lines = absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  const json first = json::parse(lines[0], nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(first.is_discarded()) << lines[0];
  EXPECT_EQ(first["level"], "warning");
  EXPECT_EQ(first["component"], "gradsyncd");
  EXPECT_EQ(first["event"], "tensor_refused");
  EXPECT_EQ(first["job"], "default");
  EXPECT_EQ(first["tensor"], kNastyName);
  EXPECT_EQ(first["bytes"], "12");
  EXPECT_TRUE(first.contains("time"));
  EXPECT_EQ(json::parse(lines[1])["event"], "started");
}

TEST(LogOutputTest, JournalFieldsCarryTheMessagePriorityAndEachFieldUpperCased) {
  const std::string line = "event=tensor_refused job-id=a.b tensor=" + LogValue(kNastyName);
  EXPECT_THAT(JournalFields(spdlog::level::err, line),
              ElementsAre("MESSAGE=" + line, "PRIORITY=3", "SYSLOG_IDENTIFIER=gradsyncd",
                          "GRADSYNC_EVENT=tensor_refused", "GRADSYNC_JOB_ID=a.b",
                          "GRADSYNC_TENSOR=" + kNastyName));
}

TEST(LogOutputTest, UnknownFormatIsRefusedNamingIt) {
  const absl::Status st = ConfigureLogging("xml", "%v");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("--log-format xml"));
}

// A real gradsyncd with --log-format=json: every line it writes is a JSON
// object, and its start-up line carries its fields.
TEST(LogOutputTest, GradsyncdWithJsonFormatWritesOnlyJsonLines) {
  testing::ScratchDir dir;
  const std::string socket = dir.File("d.sock");
  testing::Process daemon = testing::Process::Spawn(
      {testing::Runfile("daemon/gradsyncd"), "--socket=" + socket,
       "--listen=", "--shm-prefix=gslog" + std::to_string(getpid()), "--log-format=json"},
      dir.File("daemon.out"));
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  ASSERT_TRUE(testing::WaitForFile(socket, std::chrono::seconds(30))) << daemon.Log();
  daemon.Signal(SIGTERM);
  const testing::ExitStatus st = daemon.Wait(std::chrono::seconds(30));
  EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << daemon.Log();

  const std::vector<std::string> lines = absl::StrSplit(daemon.Log(), '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  bool started = false;
  for (const std::string& line : lines) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_EQ(j["component"], "gradsyncd") << line;
    if (j.value("event", "") == "started") started = true;
  }
  EXPECT_TRUE(started) << daemon.Log();
}

TEST(LogOutputTest, GradsyncdRefusesAnUnknownFormatNamingIt) {
  testing::ScratchDir dir;
  testing::Process daemon =
      testing::Process::Spawn({testing::Runfile("daemon/gradsyncd"),
                               "--socket=" + dir.File("d.sock"), "--listen=", "--log-format=xml"},
                              dir.File("daemon.out"));
  const testing::ExitStatus st = daemon.Wait(std::chrono::seconds(30));
  EXPECT_TRUE(st.exited) << st.ToString();
  EXPECT_EQ(st.code, 2);
  EXPECT_THAT(daemon.Log(), HasSubstr("--log-format xml"));
}

}  // namespace
}  // namespace gradsync
