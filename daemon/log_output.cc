#include "daemon/log_output.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <syslog.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/log_fields.h"
#include "daemon/systemd_library.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace gradsync {
namespace {

using json = nlohmann::json;

std::string LevelName(spdlog::level::level_enum level) {
  const auto name = spdlog::level::to_string_view(level);
  return std::string(name.data(), name.size());
}

int SyslogPriority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::critical:
      return LOG_CRIT;
    case spdlog::level::err:
      return LOG_ERR;
    case spdlog::level::warn:
      return LOG_WARNING;
    case spdlog::level::info:
      return LOG_INFO;
    default:
      return LOG_DEBUG;
  }
}

// journald field names: upper-case letters, digits and '_'.
std::string JournalKey(absl::string_view key) {
  std::string out = "GRADSYNC_";
  for (char c : key) out += absl::ascii_isalnum(c) ? absl::ascii_toupper(c) : '_';
  return out;
}

// Sends each message to the journal with its fields (JournalFields).
class JournalSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit JournalSink(const SystemdLibrary& systemd) : systemd_(systemd) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::vector<std::string> fields =
        JournalFields(msg.level, absl::string_view(msg.payload.data(), msg.payload.size()));
    std::vector<iovec> iov;
    iov.reserve(fields.size());
    for (const std::string& f : fields) {
      iov.push_back(iovec{const_cast<char*>(f.data()), f.size()});
    }
    systemd_.journal_sendv(iov.data(), static_cast<int>(iov.size()));
  }
  void flush_() override {}

 private:
  const SystemdLibrary& systemd_;
};

}  // namespace

void JsonLogFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  json line = json::object();
  line["time"] =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3S%Ez", absl::FromChrono(msg.time), absl::LocalTimeZone());
  line["level"] = LevelName(msg.level);
  line["component"] = component_;
  for (auto& [key, value] :
       ParseLogFields(absl::string_view(msg.payload.data(), msg.payload.size()))) {
    line[key] = std::move(value);
  }
  // Invalid UTF-8 in a tensor name must not drop the line.
  const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  dest.append(text.data(), text.data() + text.size());
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>(component_);
}

std::vector<std::string> JournalFields(spdlog::level::level_enum level, absl::string_view message) {
  std::vector<std::string> fields = {
      absl::StrCat("MESSAGE=", message),
      absl::StrCat("PRIORITY=", SyslogPriority(level)),
      "SYSLOG_IDENTIFIER=gradsyncd",
  };
  for (const auto& [key, value] : ParseLogFields(message)) {
    if (key == "message") continue;  // already the MESSAGE
    fields.push_back(absl::StrCat(JournalKey(key), "=", value));
  }
  return fields;
}

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;  // NOLINT(runtime/int): sscanf's %llu
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (fstat(2, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

absl::Status ConfigureLogging(const std::string& format, const std::string& text_pattern) {
  const std::string chosen = format.empty() ? (StderrIsJournal() ? "journal" : "text") : format;
  if (chosen == "text") {
    spdlog::set_pattern(text_pattern);
  } else if (chosen == "json") {
    spdlog::set_formatter(std::make_unique<JsonLogFormatter>("gradsyncd"));
  } else if (chosen == "journal") {
    absl::StatusOr<const SystemdLibrary*> systemd = LoadSystemdLibrary();
    if (!systemd.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--log-format journal: ", systemd.status().message()));
    }
    auto logger =
        std::make_shared<spdlog::logger>("gradsyncd", std::make_shared<JournalSink>(**systemd));
    logger->set_level(spdlog::default_logger()->level());
    spdlog::set_default_logger(std::move(logger));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format ", format, ": expected text, json or journal"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
