// The rule both rendezvous (the embedded leader and etcd) apply to the
// iterations an elastic job's survivors resume at (docs/DESIGN.md,
// "Elastic jobs"): a node's death inside an iteration's last collective can
// leave some survivors past that iteration (they completed it) and others
// still in it. One iteration apart, they form the next generation anyway
// and the ones still in it commit it from a survivor that completed it
// (daemon/engine/scheduler_split_commit.cc); further apart is impossible
// with a single death per generation, and fails every survivor.
#ifndef GRADSYNC_DAEMON_CLUSTER_RESUME_RULE_H_
#define GRADSYNC_DAEMON_CLUSTER_RESUME_RULE_H_

#include <cstdint>
#include <map>
#include <string>

namespace gradsync {

// `resumes`: each survivor's node rank and the iteration it resumes at.
// Empty: they may form one generation (it starts at the highest). Else the
// error every survivor gets, naming the two furthest apart and `dead_list`.
std::string CheckResumeIterations(uint64_t generation, const std::map<int, uint64_t>& resumes,
                                  const std::string& dead_list);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RESUME_RULE_H_
