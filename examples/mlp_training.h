// The model and its training arithmetic, shared by examples/mlp_trainer (the
// example: it only trains) and tests/testing/fault_trainer (the same trainer
// with the fault-injection flags the integration tests drive).
//
// Model: y = W2 · tanh(W1 x + b1) + b2 (+ gate * x0 for the samples that use
// the "gate" parameter), MSE loss on a synthetic but learnable regression
// task. Backward is written by hand and writes each gradient straight into
// the buffer it is given (gradsync's shared memory: zero copy), reporting
// each one as soon as it is final — last layer first, like autograd.
#ifndef GRADSYNC_EXAMPLES_MLP_TRAINING_H_
#define GRADSYNC_EXAMPLES_MLP_TRAINING_H_

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "client/gradsync.h"

namespace mlp {

template <typename T>
struct Model {
  // Registration order = forward order; backward produces them in reverse.
  enum { kW1, kB1, kW2, kB2, kGate, kCount };
  std::vector<std::vector<T>> params;
  std::vector<std::string> names = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "gate"};
  int dim, hidden;

  Model(int d, int h) : dim(d), hidden(h) {
    params.resize(kCount);
    params[kW1].resize(size_t(h) * d);
    params[kB1].resize(h);
    params[kW2].resize(h);
    params[kB2].resize(1);
    params[kGate].resize(1);
    std::mt19937_64 gen(1234);
    std::normal_distribution<double> n(0.0, 1.0);
    for (auto& w : params[kW1]) w = static_cast<T>(n(gen) / std::sqrt(double(d)));
    for (auto& w : params[kW2]) w = static_cast<T>(n(gen) / std::sqrt(double(h)));
  }
};

// The samples one backward pass covers: [first, last) of the global batch
// of micro-batch `micro` of step `step` (sample s of a step is the same on
// every trainer). The gradient is the sum over them divided by
// `denominator`; the gate takes part for samples >= gate_from only.
struct Samples {
  int step = 0;
  int micro = 0;
  int first = 0;
  int last = 0;
  double denominator = 1;
  int gate_from = 0;
};

// The order autograd would produce the gradients in: last layer first.
std::vector<int> BackwardOrder();

// Adds to grads[p] the gradient of (1/denominator) * sum over `samples` of
// 0.5 (pred - y)^2, parameter by parameter in `order`, calling
// on_final(p) (when set) as each is final; returns the summed loss.
template <typename T>
double Backward(const Model<T>& model, const Samples& samples, T* const* grads,
                const std::vector<int>& order, const std::function<void(int)>& on_final);

// SGD (when `apply`), then zero_grad.
template <typename T>
void SgdStep(Model<T>& model, T* const* grads, double lr, bool apply);

// The sum of every weight: one number to compare trainers by eye.
template <typename T>
double Checksum(const Model<T>& model);

// The weights as "name value" lines (what the tests and the demo compare);
// false when `path` cannot be written.
template <typename T>
bool WriteWeights(const Model<T>& model, const std::string& path);

// A checkpoint: the weights and the step to resume at, written to a
// temporary file renamed over `path` (a reader never sees half of one);
// false when it cannot be written.
template <typename T>
bool SaveCheckpoint(const Model<T>& model, int next_step, const std::string& path);

// Loads a checkpoint SaveCheckpoint wrote for a model of the same shape
// into `model` and `*next_step`; false (with a message on stderr) when it
// is missing, truncated or for another model.
template <typename T>
bool LoadCheckpoint(Model<T>& model, int* next_step, const std::string& path);

// The model's gradients as gradsync tensors, in registration order.
template <typename T>
std::vector<gs_tensor_spec> TensorSpecs(const Model<T>& model);

// Reports a failed gradsync call, closes the client and returns the exit
// code 10 + st, so a test can tell which gs_status stopped the trainer.
int Die(gs_client* c, const char* what, gs_status st);

}  // namespace mlp

#endif  // GRADSYNC_EXAMPLES_MLP_TRAINING_H_
