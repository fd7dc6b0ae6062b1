#include "common/layout.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"

namespace gradsync {

std::string Describe(const TensorInfo& t) {
  return absl::StrCat("'", t.name, "' ", DTypeName(t.dtype), "[", t.numel, "]",
                      t.device >= 0 ? absl::StrCat(" on cuda:", t.device) : "");
}

absl::StatusOr<Layout> LayoutFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs) {
  if (specs.empty()) return absl::InvalidArgumentError("the layout has no tensors");
  if (static_cast<size_t>(specs.size()) > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout has ", specs.size(), " tensors; at most ", kMaxTensors));
  }
  Layout layout;
  layout.reserve(specs.size());
  absl::flat_hash_set<std::string> names;
  uint64_t total = 0;
  int first_cpu = -1, first_cuda = -1;
  for (int i = 0; i < specs.size(); ++i) {
    const v1::TensorSpec& s = specs[i];
    if (s.name().empty() || s.name().size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " has an empty or too long name"));
    }
    if (!names.insert(s.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " '", s.name(), "': the name is registered twice"));
    }
    if (!IsValidDType(s.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " '", s.name(), "': unknown dtype ", s.dtype()));
    }
    if (s.numel() == 0 || s.numel() > kMaxLayoutBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " '", s.name(), "': bad element count ", s.numel()));
    }
    if (s.device() < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " '", s.name(), "': bad device ", s.device()));
    }
    // One layout is either all CPU (the shared-memory arena) or all CUDA
    // (the GPU path): the two are reduced by different engines.
    const int& first_of_kind = s.device() >= 0 ? first_cuda : first_cpu;
    const int& first_of_other = s.device() >= 0 ? first_cpu : first_cuda;
    if (first_of_other >= 0) {
      const int cpu = s.device() >= 0 ? first_of_other : i;
      const int cuda = s.device() >= 0 ? i : first_of_other;
      return absl::InvalidArgumentError(absl::StrCat(
          "the layout mixes CPU and CUDA tensors: tensor ", cpu, " '", specs[cpu].name(),
          "' is on the CPU and tensor ", cuda, " '", specs[cuda].name(),
          "' on cuda:", specs[cuda].device(), "; register all gradients on one kind of device"));
    }
    if (first_of_kind < 0) (s.device() >= 0 ? first_cuda : first_cpu) = i;
    TensorInfo t{s.name(), static_cast<DType>(s.dtype()), s.numel(), s.device()};
    total += t.bytes();
    if (total > kMaxLayoutBytes) {
      return absl::InvalidArgumentError(absl::StrCat("the layout is larger than ",
                                                     kMaxLayoutBytes >> 30, " GiB at tensor ", i,
                                                     " '", s.name(), "'"));
    }
    layout.push_back(std::move(t));
  }
  return layout;
}

uint64_t LayoutHash(const Layout& layout) {
  Fnv1a h;
  h.AddValue<uint64_t>(layout.size());
  for (const TensorInfo& t : layout) {
    h.AddValue<uint64_t>(t.name.size());
    h.Add(t.name.data(), t.name.size());
    h.AddValue<int32_t>(static_cast<int32_t>(t.dtype));
    h.AddValue<uint64_t>(t.numel);
    h.AddValue<int32_t>(t.device >= 0 ? 1 : 0);  // which GPU is a local detail
  }
  return h.hash();
}

std::optional<std::string> FirstDifference(const Layout& a, const Layout& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo& x = a[i];
    const TensorInfo& y = b[i];
    if (x.name != y.name || x.dtype != y.dtype || x.numel != y.numel ||
        (x.device >= 0) != (y.device >= 0)) {
      return absl::StrCat("tensor ", i, ": ", Describe(x), " vs ", Describe(y));
    }
  }
  if (a.size() != b.size()) {
    return absl::StrCat("tensor count: ", a.size(), " vs ", b.size(), " (first extra: tensor ", n,
                        " ", Describe(a.size() > n ? a[n] : b[n]), ")");
  }
  return std::nullopt;
}

}  // namespace gradsync
