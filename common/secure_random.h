// Randomness an attacker must not predict (session ids, segment names),
// from the kernel's CSPRNG (getrandom(2)), never from a seeded PRNG whose
// state can be recovered from its outputs.
#ifndef GRADSYNC_COMMON_SECURE_RANDOM_H_
#define GRADSYNC_COMMON_SECURE_RANDOM_H_

#include <cstdint>
#include <string>

namespace gradsync {

// 64 random bits. Blocks only until the kernel's pool is initialized (early
// boot); a failure of getrandom(2) other than EINTR aborts: continuing with
// guessable ids would be worse.
uint64_t SecureRandom64();

// SecureRandom64() as 16 lowercase hex digits (a name component).
std::string SecureRandomHex();

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_SECURE_RANDOM_H_
