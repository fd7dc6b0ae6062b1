// Files of multi-process tests: a scratch directory for logs and unix
// sockets, reading a file whole, and waiting for one to appear.
#ifndef GRADSYNC_TESTS_TESTING_FILES_H_
#define GRADSYNC_TESTS_TESTING_FILES_H_

#include <chrono>
#include <string>

namespace gradsync::testing {

// A fresh directory /tmp/<tag>.XXXXXX, removed with everything in it on
// destruction. Short on purpose: a unix socket path must fit in 108 bytes,
// and Bazel's test temp dirs are longer than that.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "gst");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }  // empty if mkdtemp failed
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The file's contents ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// Writes `token` to `path` with mode 0600, as gradsyncd wants a job token
// file; false if it cannot.
bool WriteTokenFile(const std::string& path, const std::string& token);

// Waits until `path` exists; false past `timeout`.
bool WaitForFile(const std::string& path, std::chrono::milliseconds timeout);

// Bazel's per-test temp dir ($TEST_TMPDIR), else /tmp: for files, not sockets.
std::string TestTmpDir();

// Path of a file in this test's runfiles, e.g. "daemon/gradsyncd"; run by
// hand from the workspace root, the one under bazel-bin/.
std::string Runfile(const std::string& workspace_relative);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_FILES_H_
