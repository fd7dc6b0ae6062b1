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
    {
      absl::MutexLock lock(&mu_);
      if (auto it = fetched_.find(key); it != fetched_.end()) {
        std::vector<char> value(it->second.begin(), it->second.end());
        fetched_.erase(it);
        return value;
      }
    }
    absl::StatusOr<std::optional<std::string>> value = store_->Get(key);
    if (!value.ok()) throw GlooStoreError(value.status());
    if (value->has_value()) return std::vector<char>((*value)->begin(), (*value)->end());
    // Gloo's own stores block in get() until the key exists.
    if (attempt == 0) wait({key});
  }
  throw GlooStoreError(absl::InternalError(
      absl::StrCat("key '", key, "' is missing right after Wait reported it set")));
}

void GlooStore::WaitAndKeep(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::StatusOr<std::map<std::string, std::string>> values = store_->WaitForValues(keys, timeout);
  if (!values.ok()) throw GlooStoreError(values.status());
  absl::MutexLock lock(&mu_);
  fetched_.merge(*values);
}

void GlooStore::wait(const std::vector<std::string>& keys) { WaitAndKeep(keys, default_timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // Gloo passes 0 for "no timeout": use ours rather than waiting forever.
  WaitAndKeep(keys, timeout.count() > 0 ? absl::FromChrono(timeout) : default_timeout_);
}

}  // namespace gradsync
