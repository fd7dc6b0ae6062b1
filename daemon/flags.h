// gradsyncd's flags come from three places, all spelled with the dashed
// names the docs use: the command line, config files (--config FILE or
// --flagfile=FILE, one --name=value per line) and GRADSYNCD_<NAME>
// environment variables (so systemd's EnvironmentFile and a k8s env list
// set flags without a shell). The command line wins over the environment,
// which wins over config files; unset flags keep DaemonConfig's defaults.
#ifndef GRADSYNC_DAEMON_FLAGS_H_
#define GRADSYNC_DAEMON_FLAGS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// The flags gradsyncd defines itself (not absl's own), sorted by name.
std::vector<const absl::CommandLineFlag*> DaemonFlags();

// node_rank -> node-rank, and -> GRADSYNCD_NODE_RANK.
std::string DashedFlagName(absl::string_view flag_name);
std::string DaemonFlagEnvName(absl::string_view flag_name);

// What `gradsyncd --help` prints: every flag with its dashed name, type,
// default and environment variable.
std::string DaemonFlagsHelp();

// The argument list for absl::ParseCommandLine: argv[0], then the config
// files' lines, then the GRADSYNCD_* variables of `env`, then the rest of
// the command line, every flag name with underscores. A missing file, a
// malformed line or a GRADSYNCD_* variable naming no flag is an
// INVALID_ARGUMENT naming it.
absl::StatusOr<std::vector<std::string>> DaemonArgs(const std::vector<std::string>& argv,
                                                    const std::map<std::string, std::string>& env);

// Parses the process's flags into absl's registry. Returns the exit status
// when the process should end now: 0 after --help, 2 on a bad source.
std::optional<int> ParseDaemonFlags(int argc, char** argv);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_FLAGS_H_
