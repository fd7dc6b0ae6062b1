// The job token's stand-in in etcd. A rendezvous kept in etcd must not hold
// the job token in plain text (whoever may read etcd, a backup of it, or
// another job sharing the cluster would learn it). The first daemon of the
// job stores a proof instead: a random salt and HMAC-SHA256 keyed with the
// token over the job id and that salt (OpenSSL). Every later daemon
// recomputes it with its own token and compares in constant time: a daemon
// given another token is refused (UNAUTHENTICATED) before it joins, and the
// stored proof does not reveal the token (a token guessed offline against it
// is the risk a weak token always runs). Who may write etcd at all is
// etcd's to decide (TLS client certificates, users): a writer can replace
// the proof, as it can every record of the job.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_TOKEN_PROOF_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_TOKEN_PROOF_H_

#include <string>

namespace gradsync {

// "v1:<salt hex>:<hmac hex>" for `token` of `job_id` with a fresh salt.
std::string MakeEtcdTokenProof(const std::string& token, const std::string& job_id);
// Whether `proof` (as MakeEtcdTokenProof wrote it) was made with `token`
// for `job_id`; false for a malformed proof.
bool MatchesEtcdTokenProof(const std::string& proof, const std::string& token,
                           const std::string& job_id);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_TOKEN_PROOF_H_
