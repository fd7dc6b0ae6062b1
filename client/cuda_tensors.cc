#include "client/cuda_tensors.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status_code.h"

namespace gradsync {
namespace {

absl::Status Bad(const std::string& message) { return MakeError(v1::INVALID_ARGUMENT, message); }

absl::Status DeviceError(const absl::Status& st, const std::string& what) {
  return MakeError(CodeOf(st) == v1::OK ? v1::INTERNAL : CodeOf(st),
                   absl::StrCat(what, ": ", st.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTensors>> CudaTensors::Prepare(
    std::shared_ptr<gpu::TrainerDevice> device, const std::vector<TensorSpec>& specs,
    void* native_stream, v1::RegisterRequest* req) {
  if (specs.empty()) return Bad("no tensors to register");
  const TensorSpec& first = specs[0];
  const bool flat = first.cuda_ptr == nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    if (s.device < 0) {
      return Bad(absl::StrCat("the layout mixes CPU and CUDA tensors: tensor ", i, " '", s.name,
                              "' is on the CPU and tensor 0 '", first.name, "' on cuda:",
                              first.device, "; register all gradients on one kind of device"));
    }
    if (s.device != first.device) {
      // One trainer, one GPU: the daemon pairs each trainer with one NCCL rank.
      return Bad(absl::StrCat("tensor ", i, " '", s.name, "' is on cuda:", s.device,
                              " but tensor 0 '", first.name, "' on cuda:", first.device,
                              ": a trainer's gradients must all be on one GPU"));
    }
    if ((s.cuda_ptr == nullptr) != flat) {
      return Bad(absl::StrCat(
          "tensor ", i, " '", s.name, "' ", s.cuda_ptr ? "has" : "has no",
          " cuda_ptr but tensor 0 '", first.name, "' ", flat ? "has none" : "has one",
          ": pass a cuda_ptr for every tensor (your memory) or for none (the daemon's buffer)"));
    }
  }

  std::unique_ptr<CudaTensors> c(new CudaTensors());
  c->device_ = std::move(device);
  c->flat_ = flat;
  c->stream_ = c->device_->WrapStream(native_stream);
  absl::StatusOr<gpu::DeviceId> id = c->device_->IdOfOrdinal(first.device);
  if (!id.ok()) return DeviceError(id.status(), absl::StrCat("identifying cuda:", first.device));
  c->device_id_ = *id;
  c->ptrs_.assign(specs.size(), nullptr);

  v1::CudaRegistration* reg = req->mutable_cuda();
  reg->set_device_id(c->device_id_);
  reg->set_mode(flat ? v1::CudaRegistration::FLAT_BUFFER : v1::CudaRegistration::USER_POINTER);

  // User pointer: one export per distinct allocation base.
  std::map<void*, uint32_t> bases;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    c->names_.push_back(s.name);
    if (flat) continue;
    absl::StatusOr<gpu::Allocation> a = c->device_->FindAllocation(s.cuda_ptr);
    if (!a.ok()) {
      return Bad(absl::StrCat("tensor ", i, " '", s.name,
                              "': cuda_ptr is not device memory of "
                              "this process: ",
                              a.status().message()));
    }
    if (a->device != c->device_id_) {
      return Bad(absl::StrCat("tensor ", i, " '", s.name, "': cuda_ptr lives on ", a->device,
                              ", not on cuda:", s.device, " (", c->device_id_, ")"));
    }
    const uint64_t offset = static_cast<uint8_t*>(s.cuda_ptr) - static_cast<uint8_t*>(a->base);
    const uint64_t bytes = s.numel * DTypeSize(s.dtype);
    if (offset > a->size || bytes > a->size - offset) {
      return Bad(absl::StrCat("tensor ", i, " '", s.name, "': ", bytes, " bytes at offset ", offset,
                              " run past its ", a->size, "-byte allocation"));
    }
    auto [it, inserted] = bases.emplace(a->base, static_cast<uint32_t>(bases.size()));
    if (inserted) {
      absl::StatusOr<gpu::IpcHandle> h = c->device_->ExportMemory(a->base);
      if (!h.ok()) {
        return DeviceError(
            h.status(), absl::StrCat("exporting the allocation of tensor ", i, " '", s.name, "'"));
      }
      reg->add_allocation_handles(h->ToBytes());
    }
    v1::CudaBuffer* cb = req->mutable_tensors(static_cast<int>(i))->mutable_cuda();
    cb->set_allocation(it->second);
    cb->set_offset(offset);
    c->ptrs_[i] = s.cuda_ptr;
  }

  const size_t pool = std::min(specs.size(), kReadyEventPool);
  for (size_t k = 0; k < pool; ++k) {
    absl::StatusOr<gpu::Event*> e = c->device_->CreateEvent(c->device_id_);
    if (!e.ok()) {
      return DeviceError(e.status(), absl::StrCat("creating readiness event ", k, " of ", pool,
                                                  " on ", c->device_id_));
    }
    c->events_.push_back(*e);
    absl::StatusOr<gpu::IpcHandle> h = c->device_->ExportEvent(*e);
    if (!h.ok()) {
      return DeviceError(h.status(), absl::StrCat("exporting readiness event ", k, " of ", pool));
    }
    reg->add_event_handles(h->ToBytes());
  }
  c->slot_use_.assign(pool, SlotUse{});
  return c;
}

CudaTensors::~CudaTensors() {
  for (gpu::Event* e : events_) device_->DestroyEvent(e);
  if (flat_base_ != nullptr) device_->CloseMemory(flat_base_).IgnoreError();
  if (broadcast_base_ != nullptr) device_->CloseMemory(broadcast_base_).IgnoreError();
}

absl::Status CudaTensors::Attach(const v1::RegisterResponse& resp, const Layout& layout) {
  if (!flat_) return absl::OkStatus();
  absl::StatusOr<gpu::IpcHandle> h = gpu::IpcHandle::FromBytes(resp.flat_buffer_handle());
  if (!h.ok())
    return MakeError(v1::INTERNAL, absl::StrCat("flat buffer handle: ", h.status().message()));
  absl::StatusOr<void*> base = device_->OpenMemory(device_id_, *h);
  if (!base.ok()) {
    return DeviceError(base.status(),
                       absl::StrCat("mapping the daemon's gradient buffer on ", device_id_));
  }
  flat_base_ = *base;
  for (size_t i = 0; i < layout.size(); ++i) {
    const uint64_t off = resp.tensor_offsets(static_cast<int>(i));
    if (off > resp.flat_buffer_bytes() || layout[i].bytes() > resp.flat_buffer_bytes() - off) {
      return MakeError(v1::INTERNAL, absl::StrCat("tensor ", i, " '", layout[i].name,
                                                  "' lies outside the daemon's ",
                                                  resp.flat_buffer_bytes(), "-byte buffer"));
    }
    ptrs_[i] = static_cast<uint8_t*>(flat_base_) + off;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> CudaTensors::Record(size_t index, uint64_t iteration) {
  const size_t slot = next_slot_;
  SlotUse& use = slot_use_[slot];
  gpu::Event* event = events_[slot];
  if (use.recorded && use.iteration == iteration && use.stream != stream_) {
    // The daemon may still poll this slot for an earlier mark of this
    // iteration, recorded on another stream: the new recording must not
    // complete before that one, or the daemon would read that tensor early.
    if (absl::Status st = device_->StreamWaitEvent(stream_, event); !st.ok()) {
      return DeviceError(st, absl::StrCat("ordering readiness event ", slot, " of tensor ", index,
                                          " '", names_[index], "' after its previous recording"));
    }
  }
  if (absl::Status st = device_->RecordEvent(event, stream_); !st.ok()) {
    return DeviceError(st, absl::StrCat("recording the readiness event of tensor ", index, " '",
                                        names_[index], "'"));
  }
  use = SlotUse{true, iteration, stream_};
  next_slot_ = (slot + 1) % events_.size();
  return static_cast<uint16_t>(slot);
}

absl::Status CudaTensors::Zero(size_t index, uint64_t bytes) {
  if (absl::Status st = device_->MemsetAsync(ptrs_[index], bytes, stream_); !st.ok()) {
    return DeviceError(st, absl::StrCat("zeroing unused tensor ", index, " '", names_[index], "'"));
  }
  return absl::OkStatus();
}

void CudaTensors::SetStream(void* native) { stream_ = device_->WrapStream(native); }

absl::StatusOr<uint8_t*> CudaTensors::BroadcastSlots(const std::string& handle) {
  if (broadcast_base_ != nullptr && handle == broadcast_handle_) {
    return static_cast<uint8_t*>(broadcast_base_);
  }
  if (broadcast_base_ != nullptr) {
    // One staging per job and GPU: a different handle is a daemon bug.
    return absl::InternalError("gs_broadcast: the daemon answered another device staging");
  }
  absl::StatusOr<gpu::IpcHandle> h = gpu::IpcHandle::FromBytes(handle);
  if (!h.ok()) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat("gs_broadcast's device staging handle: ", h.status().message()));
  }
  absl::StatusOr<void*> base = device_->OpenMemory(device_id_, *h);
  if (!base.ok()) {
    return DeviceError(base.status(),
                       absl::StrCat("mapping gs_broadcast's device staging on ", device_id_));
  }
  broadcast_base_ = *base;
  broadcast_handle_ = handle;
  return static_cast<uint8_t*>(broadcast_base_);
}

absl::Status CudaTensors::ReleaseMemory(absl::Duration timeout) {
  if (flat_base_ == nullptr && broadcast_base_ == nullptr) return absl::OkStatus();
  if (absl::Status st = device_->SynchronizeStream(device_id_, stream_, timeout); !st.ok()) {
    return DeviceError(st,
                       absl::StrCat("draining the stream before unmapping the daemon's gradient "
                                    "buffer on ",
                                    device_id_, " (left mapped)"));
  }
  if (broadcast_base_ != nullptr) {
    void* slots = broadcast_base_;
    broadcast_base_ = nullptr;
    if (absl::Status st = device_->CloseMemory(slots); !st.ok()) {
      return DeviceError(st,
                         absl::StrCat("unmapping gs_broadcast's device staging on ", device_id_));
    }
  }
  if (flat_base_ == nullptr) return absl::OkStatus();
  void* base = flat_base_;
  flat_base_ = nullptr;
  if (absl::Status st = device_->CloseMemory(base); !st.ok()) {
    return DeviceError(st, absl::StrCat("unmapping the daemon's gradient buffer on ", device_id_));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
