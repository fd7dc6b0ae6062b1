// Where and how gradsyncd's key=value log lines go (--log-format):
//   text     the key=value line on stderr (the default);
//   json     one JSON object per line on stderr, the line's fields as keys
//            plus time, level and component;
//   journal  the systemd journal (sd_journal_send), each field as a
//            GRADSYNC_<KEY> journal field, the line as MESSAGE. The default
//            when stderr is the journal ($JOURNAL_STREAM names it).
#ifndef GRADSYNC_DAEMON_LOG_OUTPUT_H_
#define GRADSYNC_DAEMON_LOG_OUTPUT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/formatter.h"
#include "spdlog/spdlog.h"

namespace gradsync {

// Formats each log message as one JSON object per line.
class JsonLogFormatter final : public spdlog::formatter {
 public:
  explicit JsonLogFormatter(std::string component) : component_(std::move(component)) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;

 private:
  const std::string component_;
};

// The journal entry for one message: "MESSAGE=...", "PRIORITY=<syslog
// level>", "SYSLOG_IDENTIFIER=gradsyncd" and one GRADSYNC_<KEY>=value per
// field (keys upper-cased, other characters as '_', as journald requires).
std::vector<std::string> JournalFields(spdlog::level::level_enum level, absl::string_view message);

// True when stderr is the journal stream systemd set up ($JOURNAL_STREAM's
// device:inode is stderr's), not one merely inherited from a parent.
bool StderrIsJournal();

// Installs the default logger for `format` ("text", "json", "journal", or
// "" to pick journal under systemd and text otherwise); INVALID_ARGUMENT
// naming the value if it is none of those.
absl::Status ConfigureLogging(const std::string& format, const std::string& text_pattern);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LOG_OUTPUT_H_
