#include "daemon/cluster/etcd_token_proof.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/secure_random.h"

namespace gradsync {
namespace {

std::string Hmac(const std::string& token, const std::string& job_id, const std::string& salt) {
  const std::string message = absl::StrCat("gradsync job ", job_id, " ", salt);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

std::string MakeEtcdTokenProof(const std::string& token, const std::string& job_id) {
  const std::string salt = SecureRandomHex();
  return absl::StrCat("v1:", salt, ":", Hmac(token, job_id, salt));
}

bool MatchesEtcdTokenProof(const std::string& proof, const std::string& token,
                           const std::string& job_id) {
  const std::vector<std::string> parts = absl::StrSplit(proof, ':');
  if (parts.size() != 3 || parts[0] != "v1" || parts[1].empty()) return false;
  const std::string expected = Hmac(token, job_id, parts[1]);
  return expected.size() == parts[2].size() &&
         CRYPTO_memcmp(expected.data(), parts[2].data(), expected.size()) == 0;
}

}  // namespace gradsync
