#include "daemon/backends/gloo_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {

GlooStore::GlooStore(std::shared_ptr<KeyValueStore> store, absl::Duration default_timeout)
    : store_(std::move(store)), default_timeout_(default_timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(key, std::string_view(data.data(), data.size()));
  if (!status.ok()) throw GlooStoreError(std::move(status));
}

std::vector<char> GlooStore::get(const std::string& key) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::optional<std::string>> value = store_->Get(key);
    if (!value.ok()) throw GlooStoreError(value.status());
    if (value->has_value()) return std::vector<char>((*value)->begin(), (*value)->end());
    // Gloo's own stores block in get() until the key exists.
    if (attempt == 0) wait({key});
  }
  throw GlooStoreError(absl::InternalError(
      absl::StrCat("key '", key, "' is missing right after Wait reported it set")));
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  absl::Status status = store_->Wait(keys, default_timeout_);
  if (!status.ok()) throw GlooStoreError(std::move(status));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // Gloo passes 0 for "no timeout": use ours rather than waiting forever.
  const absl::Duration d = timeout.count() > 0 ? absl::FromChrono(timeout) : default_timeout_;
  absl::Status status = store_->Wait(keys, d);
  if (!status.ok()) throw GlooStoreError(std::move(status));
}

}  // namespace gradsync
