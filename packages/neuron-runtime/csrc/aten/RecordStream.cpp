// Tensor.record_stream for neuron tensors: what DDP's side-stream input copies, FSDP and user
// code call to keep a block alive until work queued on another stream has used it. Streams
// run in order on the host, so the allocator has nothing to defer; the arguments are still
// checked as CUDA checks them.
#include "runtime/NeuronCachingAllocator.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <torch/library.h>

namespace neuron {
namespace {

// Dispatched for neuron tensors only, so `self` is always on a NeuronCore.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: a neuron tensor can only be recorded on a neuron stream, got a ",
              stream.device_type(), " stream; pass torch.neuron.current_stream() or a torch.neuron.Stream");
  TORCH_CHECK(stream.device_index() == self.device().index(),
              "record_stream: the tensor is on ", self.device(), " but the stream belongs to neuron:",
              static_cast<int>(stream.device_index()), "; record it on a stream of the tensor's device");
  cachingAllocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", record_stream);
}

}  // namespace neuron
