#include "examples/mlp_training.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace mlp {
namespace {

// Deterministic data: sample s of step t is the same on every trainer.
template <typename T>
void MakeSample(int step, int micro, int sample, int dim, T* x, T* y) {
  std::mt19937_64 gen(0x9e3779b97f4a7c15ull ^ (uint64_t(step) << 40) ^ (uint64_t(micro) << 32) ^
                      uint64_t(sample));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  double z = 0;
  for (int d = 0; d < dim; ++d) {
    x[d] = static_cast<T>(u(gen));
    z += std::sin(0.7 * (d + 1)) * static_cast<double>(x[d]);
  }
  *y = static_cast<T>(std::tanh(z) + 0.1 * static_cast<double>(x[0]));
}

}  // namespace

std::vector<int> BackwardOrder() {
  using M = Model<float>;
  return {M::kGate, M::kB2, M::kW2, M::kB1, M::kW1};
}

template <typename T>
double Backward(const Model<T>& m, const Samples& samples, T* const* grads,
                const std::vector<int>& order, const std::function<void(int)>& on_final) {
  const bool gate_used = samples.last > samples.gate_from;  // by any sample of these
  const int D = m.dim, H = m.hidden;
  std::vector<T> x(D), h(H);
  std::vector<double> gW1(size_t(H) * D, 0), gb1(H, 0), gW2(H, 0);
  double gb2 = 0, gGate = 0, loss = 0;
  for (int s = samples.first; s < samples.last; ++s) {
    const bool gated = s >= samples.gate_from;
    T y;
    MakeSample(samples.step, samples.micro, s, D, x.data(), &y);
    double pred = m.params[Model<T>::kB2][0];
    for (int j = 0; j < H; ++j) {
      double a = m.params[Model<T>::kB1][j];
      for (int d = 0; d < D; ++d) a += double(m.params[Model<T>::kW1][size_t(j) * D + d]) * x[d];
      h[j] = static_cast<T>(std::tanh(a));
      pred += double(m.params[Model<T>::kW2][j]) * h[j];
    }
    if (gated) pred += double(m.params[Model<T>::kGate][0]) * x[0];
    const double err = pred - double(y);
    loss += 0.5 * err * err;
    const double g = err / samples.denominator;
    gb2 += g;
    if (gated) gGate += g * x[0];
    for (int j = 0; j < H; ++j) {
      gW2[j] += g * h[j];
      const double gh = g * double(m.params[Model<T>::kW2][j]) * (1.0 - double(h[j]) * h[j]);
      gb1[j] += gh;
      for (int d = 0; d < D; ++d) gW1[size_t(j) * D + d] += gh * x[d];
    }
  }
  auto add = [](T* dst, const std::vector<double>& src) {
    for (size_t i = 0; i < src.size(); ++i) dst[i] += static_cast<T>(src[i]);
  };
  for (int p : order) {
    switch (p) {
      case Model<T>::kGate:
        if (gate_used) grads[p][0] += static_cast<T>(gGate);
        break;
      case Model<T>::kB2:
        grads[p][0] += static_cast<T>(gb2);
        break;
      case Model<T>::kW2:
        add(grads[p], gW2);
        break;
      case Model<T>::kB1:
        add(grads[p], gb1);
        break;
      case Model<T>::kW1:
        add(grads[p], gW1);
        break;
    }
    if (on_final) on_final(p);
  }
  return loss;
}

template <typename T>
void SgdStep(Model<T>& model, T* const* grads, double lr, bool apply) {
  for (int p = 0; p < Model<T>::kCount; ++p) {
    T* g = grads[p];
    for (size_t i = 0; i < model.params[p].size(); ++i) {
      if (apply) model.params[p][i] -= static_cast<T>(lr) * g[i];
      g[i] = T(0);
    }
  }
}

template <typename T>
double Checksum(const Model<T>& model) {
  double checksum = 0;
  for (const auto& p : model.params) {
    for (T v : p) checksum += double(v);
  }
  return checksum;
}

template <typename T>
bool WriteWeights(const Model<T>& model, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  for (int p = 0; p < Model<T>::kCount; ++p) {
    for (T v : model.params[p]) std::fprintf(f, "%s %.17g\n", model.names[p].c_str(), double(v));
  }
  return std::fclose(f) == 0;
}

constexpr char kCheckpointMagic[] = "mlp-checkpoint-v1";

template <typename T>
bool SaveCheckpoint(const Model<T>& model, int next_step, const std::string& path) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "%s next_step %d\n", kCheckpointMagic, next_step);
  for (int p = 0; p < Model<T>::kCount; ++p) {
    for (T v : model.params[p]) std::fprintf(f, "%s %.17g\n", model.names[p].c_str(), double(v));
  }
  if (std::fclose(f) != 0) return false;
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

template <typename T>
bool LoadCheckpoint(Model<T>& model, int* next_step, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) {
    std::fprintf(stderr, "mlp_trainer: cannot open the checkpoint %s\n", path.c_str());
    return false;
  }
  char magic[32] = {0};
  bool ok = std::fscanf(f, "%31s next_step %d", magic, next_step) == 2 &&
            std::string(magic) == kCheckpointMagic;
  char name[64];
  double v = 0;
  for (int p = 0; ok && p < Model<T>::kCount; ++p) {
    for (T& w : model.params[p]) {
      ok = std::fscanf(f, "%63s %lf", name, &v) == 2 && model.names[p] == name;
      if (!ok) break;
      w = static_cast<T>(v);
    }
  }
  ok = ok && std::fscanf(f, "%63s", name) == EOF;  // nothing more: the same model's shape
  std::fclose(f);
  if (!ok) {
    std::fprintf(stderr, "mlp_trainer: %s is not a checkpoint of this model (--dim, --hidden)\n",
                 path.c_str());
  }
  return ok;
}

template <typename T>
std::vector<gs_tensor_spec> TensorSpecs(const Model<T>& model) {
  const gs_dtype dtype = std::is_same<T, double>::value ? GS_FLOAT64 : GS_FLOAT32;
  std::vector<gs_tensor_spec> specs;
  for (int p = 0; p < Model<T>::kCount; ++p) {
    specs.push_back({model.names[p].c_str(), dtype, model.params[p].size(), -1, nullptr});
  }
  return specs;
}

int Die(gs_client* c, const char* what, gs_status st) {
  std::fprintf(stderr, "mlp_trainer: %s failed: status=%d error=\"%s\"\n", what, int(st),
               gs_last_error(c));
  if (c) gs_close(c);  // LeakSanitizer (--config=asan) reports what is left open
  return 10 + int(st);
}

#define GRADSYNC_MLP_INSTANTIATE(T)                                                                \
  template double Backward<T>(const Model<T>&, const Samples&, T* const*, const std::vector<int>&, \
                              const std::function<void(int)>&);                                    \
  template void SgdStep<T>(Model<T>&, T* const*, double, bool);                                    \
  template double Checksum<T>(const Model<T>&);                                                    \
  template bool WriteWeights<T>(const Model<T>&, const std::string&);                              \
  template bool SaveCheckpoint<T>(const Model<T>&, int, const std::string&);                       \
  template bool LoadCheckpoint<T>(Model<T>&, int*, const std::string&);                            \
  template std::vector<gs_tensor_spec> TensorSpecs<T>(const Model<T>&);
GRADSYNC_MLP_INSTANTIATE(float)
GRADSYNC_MLP_INSTANTIATE(double)
#undef GRADSYNC_MLP_INSTANTIATE

}  // namespace mlp
