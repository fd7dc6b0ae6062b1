#include "daemon/flags.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

extern char** environ;

namespace gradsync {
namespace {

// Where gradsyncd's ABSL_FLAGs are defined; absl registers its own too.
constexpr absl::string_view kDaemonFlagsFile = "daemon/main.cc";
constexpr absl::string_view kEnvPrefix = "GRADSYNCD_";
// Names the config file, from the environment (the command line uses --config).
constexpr absl::string_view kConfigEnv = "GRADSYNCD_CONFIG";

// "--node-rank=3" -> "--node_rank=3": absl spells flags with underscores.
std::string Underscored(std::string arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  const size_t end = std::min(arg.find('='), arg.size());
  for (size_t i = 2; i < end; ++i) {
    if (arg[i] == '-') arg[i] = '_';
  }
  return arg;
}

// One config file: a flag per line, "--name=value" or "--name value" or a
// bare "--name" (a bool); blank lines and '#' comments are skipped.
absl::StatusOr<std::vector<std::string>> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": cannot read it"));
  std::vector<std::string> args;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    if (!absl::StartsWith(text, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ":", number, ": '", text, "' is not --flag=value"));
    }
    std::string arg(text);
    const size_t space = arg.find_first_of(" \t");
    if (space != std::string::npos && arg.find('=') > space) {
      arg = absl::StrCat(arg.substr(0, space), "=",
                         absl::StripLeadingAsciiWhitespace(absl::string_view(arg).substr(space)));
    }
    args.push_back(Underscored(std::move(arg)));
  }
  return args;
}

bool IsHelp(const std::string& arg) { return arg == "--help" || arg == "-h"; }

}  // namespace

std::vector<const absl::CommandLineFlag*> DaemonFlags() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), kDaemonFlagsFile)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  return flags;
}

std::string DashedFlagName(absl::string_view flag_name) {
  return absl::StrReplaceAll(flag_name, {{"_", "-"}});
}

std::string DaemonFlagEnvName(absl::string_view flag_name) {
  return absl::StrCat(kEnvPrefix, absl::AsciiStrToUpper(flag_name));
}

std::string DaemonFlagsHelp() {
  std::string help =
      "gradsyncd: the per-node gradient-synchronization daemon.\n\n"
      "Usage: gradsyncd [--config FILE] [--FLAG VALUE | --FLAG=VALUE ...]\n\n"
      "Every flag can also come from a config file (--config FILE or --flagfile=FILE: one\n"
      "--flag=value per line, '#' comments) or from the environment variable shown\n"
      "(GRADSYNCD_CONFIG names a config file). The command line wins over the\n"
      "environment, which wins over config files. --helpfull is Abseil's raw listing:\n"
      "the same flags with underscored names (accepted too), and the libraries' flags.\n\n"
      "Flags:\n";
  for (const absl::CommandLineFlag* flag : DaemonFlags()) {
    const std::string type = flag->IsOfType<bool>()     ? "bool"
                             : flag->IsOfType<int>()    ? "int"
                             : flag->IsOfType<double>() ? "number"
                                                        : "string";
    absl::StrAppend(&help, "  --", DashedFlagName(flag->Name()), " (", type, ", default \"",
                    flag->DefaultValue(), "\", env ", DaemonFlagEnvName(flag->Name()), ")\n      ",
                    flag->Help(), "\n");
  }
  return help;
}

absl::StatusOr<std::vector<std::string>> DaemonArgs(const std::vector<std::string>& argv,
                                                    const std::map<std::string, std::string>& env) {
  std::vector<std::string> config_files, command_line;
  if (auto it = env.find(std::string(kConfigEnv)); it != env.end()) {
    config_files.push_back(it->second);
  }
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    bool matched = false;
    for (const char* name : {"--config", "--flagfile"}) {
      if (arg == name) {
        if (i + 1 == argv.size()) {
          return absl::InvalidArgumentError(absl::StrCat(name, " needs a FILE"));
        }
        config_files.push_back(argv[++i]);
        matched = true;
      } else if (absl::StartsWith(arg, absl::StrCat(name, "="))) {
        config_files.push_back(arg.substr(absl::string_view(name).size() + 1));
        matched = true;
      }
    }
    if (!matched) command_line.push_back(Underscored(arg));
  }

  std::vector<std::string> args = {argv.empty() ? "gradsyncd" : argv[0]};
  for (const std::string& path : config_files) {
    ASSIGN_OR_RETURN(std::vector<std::string> lines, ReadConfigFile(path));
    args.insert(args.end(), lines.begin(), lines.end());
  }
  std::map<std::string, std::string> flag_of_env;
  for (const absl::CommandLineFlag* flag : DaemonFlags()) {
    flag_of_env[DaemonFlagEnvName(flag->Name())] = std::string(flag->Name());
  }
  for (const auto& [name, value] : env) {
    if (!absl::StartsWith(name, kEnvPrefix) || name == kConfigEnv) continue;
    auto flag = flag_of_env.find(name);
    // A misspelt variable would silently leave a flag at its default.
    if (flag == flag_of_env.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", name, " names no gradsyncd flag (see gradsyncd --help)"));
    }
    args.push_back(absl::StrCat("--", flag->second, "=", value));
  }
  args.insert(args.end(), command_line.begin(), command_line.end());
  return args;
}

std::optional<int> ParseDaemonFlags(int argc, char** argv) {
  std::vector<std::string> given(argv, argv + argc);
  if (std::any_of(given.begin() + std::min(argc, 1), given.end(), IsHelp)) {
    std::fputs(DaemonFlagsHelp().c_str(), stdout);
    return 0;
  }
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq != absl::string_view::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  absl::StatusOr<std::vector<std::string>> args = DaemonArgs(given, env);
  if (!args.ok()) {
    std::fprintf(stderr, "gradsyncd: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  std::vector<char*> pointers;
  for (std::string& arg : *args) pointers.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::nullopt;
}

}  // namespace gradsync
