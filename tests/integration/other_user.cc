#include "tests/integration/other_user.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace gradsync::testing {
namespace {

constexpr char kSetpriv[] = "/usr/bin/setpriv";

}  // namespace

std::string OtherUser::Unavailable() {
  if (geteuid() != 0) return "needs root, to run programs as another user";
  if (access(kSetpriv, X_OK) != 0) return "needs /usr/bin/setpriv (util-linux)";
  return "";
}

OtherUser::OtherUser() { chmod(bin_.path().c_str(), 0755); }

std::string OtherUser::Share(const std::string& runfile) const {
  const std::filesystem::path from = Runfile(runfile);
  const std::string to = bin_.File(from.filename());
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  chmod(to.c_str(), 0755);
  return to;
}

std::vector<std::string> OtherUser::Argv(const std::vector<std::string>& argv) const {
  const std::string id = std::to_string(kUid);
  std::vector<std::string> out = {kSetpriv, "--reuid=" + id, "--regid=" + id, "--clear-groups"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace gradsync::testing
