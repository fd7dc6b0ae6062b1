// One node's average of half-precision (fp16 / bf16) gradients, a block at
// a time: each trainer's block widened to fp32 by common/half_convert.h
// (F16C / AVX2 where the CPU has them), summed ((t0 + t1) + t2 ...) and
// divided in fp32, narrowed once, copied into every trainer's memory. The
// operations, their order and the blocks a non-finite average leaves
// unwritten are LocalReducer's per-element loops' (local_reducer.cc
// AverageKernel), so both give the same bits; the per-element loops are
// what runs where the CPU lacks the instructions or software is forced.
#ifndef GRADSYNC_DAEMON_ENGINE_HALF_AVERAGE_H_
#define GRADSYNC_DAEMON_ENGINE_HALF_AVERAGE_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace gradsync {

// Elements [0, count) of each of `local` trainers' gradients (`dtype`
// kFloat16 or kBFloat16) replaced by their average (sum / divisor). With
// `check`, returns whether an average was not finite; such a block of 64
// elements (2 trainers, a tail shorter than that: such an element) keeps
// every trainer's input for the culprit search, except with one trainer
// (its input is then not finite itself).
bool AverageHalves(uint16_t* const* trainers, size_t local, uint64_t count, float divisor,
                   DType dtype, bool check);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_HALF_AVERAGE_H_
