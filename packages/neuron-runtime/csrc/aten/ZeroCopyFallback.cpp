// The boxed fallback that runs every ATen op without a dedicated neuron kernel.
//
// Arguments on neuron become zero-copy CPU views; the op is redispatched to its CPU kernel
// with CPU allocations redirected into the neuron allocator; results are adopted by the
// device (fresh memory), mapped back onto the input they alias (views, in-place, out=), or,
// as a counted last resort, copied. Along the way it enforces what a device backend must:
// one device per op, generators of the right device, and the float64 policy.
#include "aten/HostViews.h"
#include "aten/OpAccounting.h"
#include "driver/DeviceState.h"
#include "runtime/NeuronGenerator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_efficientzerotensor.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace neuron {
namespace {

// What the fallback needs to know about an operator's schema, computed once per op.
struct OpPlan {
  std::string name;
  std::vector<int> returned_write_arg;  // per return: the written argument it is, or -1
  std::vector<bool> arg_is_write;
  std::vector<bool> arg_is_generator;
  std::vector<bool> arg_is_dtype;
  bool accepts_cpu_tensors = false;  // indexing ops take CPU index tensors, as on CUDA
  int indices_arg = -1;              // their `indices` argument
  int values_arg = -1;               // index_put's `values` argument
};

bool acceptsCpuTensors(const std::string& base_name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
      "aten::_unsafe_index", "aten::_unsafe_index_put"};
  return ops.count(base_name) > 0;
}

std::unique_ptr<OpPlan> makePlan(const c10::FunctionSchema& schema) {
  auto plan = std::make_unique<OpPlan>();
  plan->name = schema.name();
  if (!schema.overload_name().empty()) plan->name += "." + schema.overload_name();
  plan->accepts_cpu_tensors = acceptsCpuTensors(schema.name());
  const auto& args = schema.arguments();
  for (const auto& arg : args) {
    if (plan->accepts_cpu_tensors && arg.name() == "indices") {
      plan->indices_arg = static_cast<int>(plan->arg_is_write.size());
    }
    if (plan->accepts_cpu_tensors && arg.name() == "values") {
      plan->values_arg = static_cast<int>(plan->arg_is_write.size());
    }
    const auto* alias = arg.alias_info();
    plan->arg_is_write.push_back(alias != nullptr && alias->isWrite());
    const auto& type = arg.real_type();
    auto kind = type->kind();
    if (kind == c10::TypeKind::OptionalType) {
      kind = type->castRaw<c10::OptionalType>()->getElementType()->kind();
    }
    plan->arg_is_generator.push_back(kind == c10::TypeKind::GeneratorType);
    plan->arg_is_dtype.push_back(kind == c10::TypeKind::ScalarTypeType);
  }
  for (const auto& ret : schema.returns()) {
    int written = -1;
    const auto* alias = ret.alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i) {
        const auto* arg_alias = args[i].alias_info();
        if (arg_alias != nullptr && arg_alias->isWrite() &&
            arg_alias->beforeSets() == alias->beforeSets()) {
          written = static_cast<int>(i);
          break;
        }
      }
    }
    plan->returned_write_arg.push_back(written);
  }
  return plan;
}

const OpPlan& planFor(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const void*, std::unique_ptr<OpPlan>> plans;
  const void* key = &op.schema();
  auto it = plans.find(key);
  if (it == plans.end()) {
    it = plans.emplace(key, makePlan(op.schema())).first;
  }
  return *it->second;
}

std::string deviceName(const c10::Device& device) {
  return device.str();
}

// Walks one op's arguments: checks devices, swaps neuron tensors for CPU views.
class ArgumentBridge {
 public:
  ArgumentBridge(const OpPlan& plan, const c10::FunctionSchema& schema, HostViewSet& views)
      : plan_(plan), schema_(schema), views_(views) {}

  at::Tensor bridgeTensor(const at::Tensor& tensor, size_t arg) {
    if (!tensor.defined()) return tensor;
    if (tensor.is_privateuseone()) {
      checkFloat64(plan_.name, tensor.scalar_type());
      noteDevice(tensor.device(), arg);
      // A ZeroTensor has no bytes to view. The ops whose ZeroTensor handling ATen leaves to
      // the kernel (dot, vdot: forward-mode AD's undefined tangents) get a CPU ZeroTensor.
      if (tensor._is_zerotensor() && !plan_.arg_is_write[arg]) {
        return at::_efficientzerotensor(tensor.sizes(), tensor.options().device(c10::kCPU));
      }
      return views_.viewOf(tensor);
    }
    // CPU scalars may join neuron tensors as inputs (as on CUDA), never as outputs. Indexing
    // ops check their indices and values themselves (checkIndexingDevices).
    const bool checked_apart = static_cast<int>(arg) == plan_.indices_arg ||
                               static_cast<int>(arg) == plan_.values_arg;
    if (!checked_apart && (tensor.dim() > 0 || plan_.arg_is_write[arg]) && first_cpu_arg_ < 0) {
      first_cpu_arg_ = static_cast<int>(arg);
    }
    return tensor;
  }

  void noteDevice(const c10::Device& device, size_t arg) {
    if (!device_) {
      device_ = device;
      return;
    }
    TORCH_CHECK(*device_ == device,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                deviceName(*device_), " and ", deviceName(device), "! (when checking argument '",
                schema_.arguments()[arg].name(), "' of ", plan_.name, ")");
  }

  // After all arguments: a non-scalar CPU tensor next to neuron tensors is a device mismatch.
  void checkNoStrayCpuTensor() const {
    if (!device_ || first_cpu_arg_ < 0) return;
    TORCH_CHECK(false,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                deviceName(*device_), " and cpu! (when checking argument '",
                schema_.arguments()[first_cpu_arg_].name(), "' of ", plan_.name,
                "). Move it with .to(\"", deviceName(*device_), "\").");
  }

  std::optional<c10::Device> device() const { return device_; }

 private:
  const OpPlan& plan_;
  const c10::FunctionSchema& schema_;
  HostViewSet& views_;
  std::optional<c10::Device> device_;
  int first_cpu_arg_ = -1;
};

c10::IValue bridgeList(const c10::IValue& value, size_t arg, ArgumentBridge& bridge) {
  if (value.isTensorList()) {
    c10::List<at::Tensor> bridged;
    const auto source = value.toTensorList();
    bridged.reserve(source.size());
    for (const at::Tensor& tensor : source) bridged.push_back(bridge.bridgeTensor(tensor, arg));
    return bridged;
  }
  const auto source = value.toList();
  c10::impl::GenericList bridged(source.elementType());
  bridged.reserve(source.size());
  for (const c10::IValue& element : source) {
    bridged.push_back(element.isTensor() ? c10::IValue(bridge.bridgeTensor(element.toTensor(), arg))
                                         : element);
  }
  return bridged;
}

c10::IValue adoptValue(c10::IValue value, c10::DeviceIndex device, HostViewSet& views,
                       const OpPlan& plan) {
  if (value.isTensor()) {
    // Moved out, so a result held by nobody else is converted in place.
    at::Tensor result = views.toNeuron(std::move(value).toTensor(), device, plan.name.c_str());
    if (result.defined()) checkFloat64(plan.name, result.scalar_type());
    return result;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> adopted;
    for (const at::Tensor& tensor : value.toTensorList()) {
      adopted.push_back(views.toNeuron(tensor, device, plan.name.c_str()));
    }
    return adopted;
  }
  if (value.isList()) {
    const auto source = value.toList();
    c10::impl::GenericList adopted(source.elementType());
    for (const c10::IValue& element : source) adopted.push_back(adoptValue(element, device, views, plan));
    return adopted;
  }
  return value;
}

void syncWrittenValue(const c10::IValue& original, const c10::IValue& bridged, HostViewSet& views,
                      const OpPlan& plan) {
  if (original.isTensor()) {
    const at::Tensor& tensor = original.toTensor();
    if (tensor.defined() && tensor.is_privateuseone()) {
      views.syncBack(tensor, bridged.toTensor(), plan.name.c_str());
    }
    return;
  }
  if (original.isTensorList()) {
    const auto neuron_list = original.toTensorList();
    const auto view_list = bridged.toTensorList();
    for (size_t i = 0; i < neuron_list.size(); ++i) {
      const at::Tensor tensor = neuron_list.get(i);
      if (tensor.defined() && tensor.is_privateuseone()) {
        views.syncBack(tensor, view_list.get(i), plan.name.c_str());
      }
    }
  }
}

// ATen's rule for indexing (check_indices_on_cpu_or_selfdevice): each index is on the CPU or on
// the indexed tensor's device. Checked before bridging, which erases the devices.
void checkIndicesOnCpuOrSelfDevice(const at::Tensor& self, const c10::IValue& indices) {
  for (const c10::IValue& element : indices.toListRef()) {
    if (!element.isTensor()) continue;
    const at::Tensor& index = element.toTensor();
    TORCH_CHECK(!index.defined() || index.is_cpu() || index.device() == self.device(),
                "indices should be either on cpu or on the same device as the indexed tensor (",
                deviceName(self.device()), ")");
  }
}

// Whether index_put_ takes ATen's masked_fill path (canDispatchToMaskedFill): the only defined
// index is one bool or uint8 mask on the indexed tensor's device.
bool indexesByOneMask(const at::Tensor& self, const c10::IValue& indices) {
  int masks = 0;
  for (const c10::IValue& element : indices.toListRef()) {
    if (!element.isTensor() || !element.toTensor().defined()) continue;
    const at::Tensor& index = element.toTensor();
    const bool is_mask = index.scalar_type() == at::kBool || index.scalar_type() == at::kByte;
    if (!is_mask || index.device() != self.device() || ++masks > 1) return false;
  }
  return masks == 1;
}

// ATen's rule for index_put_'s values: a CPU value joins a device tensor only as a 0-dim scalar
// or as the one element of a masked fill; anything else fails its TensorIterator's device check.
void checkIndexPutValues(const OpPlan& plan, const at::Tensor& self, const c10::IValue& indices,
                         const at::Tensor& values) {
  if (!values.defined() || !self.is_privateuseone() || !values.is_cpu()) return;
  if (values.dim() == 0) return;
  if (values.numel() == 1 && indexesByOneMask(self, indices)) return;
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              deviceName(self.device()), " and cpu! (when checking argument 'values' of ",
              plan.name, "). Move the values with .to(\"", deviceName(self.device()),
              "\"), or assign a Python scalar.");
}

void checkIndexingDevices(const OpPlan& plan, const torch::jit::Stack& stack, size_t first) {
  if (plan.indices_arg < 0) return;
  const c10::IValue& self = stack[first];
  const c10::IValue& indices = stack[first + static_cast<size_t>(plan.indices_arg)];
  if (!self.isTensor() || !self.toTensor().defined() || !indices.isList()) return;
  checkIndicesOnCpuOrSelfDevice(self.toTensor(), indices);
  if (plan.values_arg >= 0) {
    const c10::IValue& values = stack[first + static_cast<size_t>(plan.values_arg)];
    if (values.isTensor()) checkIndexPutValues(plan, self.toTensor(), indices, values.toTensor());
  }
}

void zeroCopyFallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                      torch::jit::Stack* stack) {
  const OpPlan& plan = planFor(op);
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;

  checkIndexingDevices(plan, *stack, first);

  HostViewSet views;
  ArgumentBridge bridge(plan, schema, views);
  std::optional<c10::Device> device_arg;
  c10::SmallVector<std::pair<size_t, c10::IValue>, 4> written;  // (argument, original value)

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (plan.arg_is_write[i] && (value.isTensor() || value.isTensorList())) {
      written.emplace_back(i, value);
    }
    if (value.isTensor()) {
      value = bridge.bridgeTensor(value.toTensor(), i);
    } else if (value.isList()) {
      value = bridgeList(value, i, bridge);
    } else if (value.isDevice() && value.toDevice().is_privateuseone()) {
      device_arg = value.toDevice();
      value = c10::Device(c10::DeviceType::CPU);
    } else if (plan.arg_is_dtype[i] && value.isInt()) {
      checkFloat64(plan.name, static_cast<c10::ScalarType>(value.toInt()));
    }
  }
  bridge.checkNoStrayCpuTensor();

  c10::Device device = bridge.device().value_or(
      device_arg.value_or(c10::Device(c10::DeviceType::PrivateUse1, currentDevice())));
  if (!device.has_index()) device = c10::Device(c10::DeviceType::PrivateUse1, currentDevice());
  checkDeviceIndex(device.index());

  for (size_t i = 0; i < num_args; ++i) {
    if (!plan.arg_is_generator[i]) continue;
    c10::IValue& value = (*stack)[first + i];
    if (value.isNone()) {
      value = at::check_generator<NeuronGeneratorImpl>(defaultGenerator(device.index()))->engine();
      continue;
    }
    const at::Generator generator = value.toGenerator();
    TORCH_CHECK(generator.device().is_privateuseone(),
                "Expected a 'neuron' device type for generator but found '",
                generator.device().type(), "' (in ", plan.name, ")");
    // Only the neuron generator routed the op here: it works on CPU tensors, which need a
    // CPU generator (the CPU kernel would otherwise draw from the device's stream).
    TORCH_CHECK(bridge.device() || device_arg,
                "Expected a 'cpu' device type for generator but found 'neuron' (in ", plan.name,
                "): the op's tensors are on the CPU. Pass a CPU torch.Generator, or move the "
                "tensors to the neuron device.");
    value = at::check_generator<NeuronGeneratorImpl>(generator)->engine();
  }

  c10::SmallVector<c10::IValue, 4> bridged_written;
  for (const auto& [arg, original] : written) bridged_written.push_back((*stack)[first + arg]);

  runOnDevice(device.index(), plan.name, [&] {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return 0;
  });

  for (size_t i = 0; i < written.size(); ++i) {
    syncWrittenValue(written[i].second, bridged_written[i], views, plan);
  }
  const size_t num_returns = schema.returns().size();
  const size_t returns_begin = stack->size() - num_returns;
  for (size_t r = 0; r < num_returns; ++r) {
    c10::IValue& value = (*stack)[returns_begin + r];
    const int written_arg = plan.returned_write_arg[r];
    if (written_arg >= 0) {
      for (const auto& [arg, original] : written) {
        if (static_cast<int>(arg) == written_arg) value = original;
      }
      continue;
    }
    value = adoptValue(std::move(value), device.index(), views, plan);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&zeroCopyFallback>());
}

// Ops with both a CPU kernel and a generic kernel PrivateUse1 would otherwise use:
// structured ops (add, mul, ...) whose "default backend" kernel builds the TensorIterator,
// allocates the output and calls the out= variant (which the fallback then runs on the CPU,
// building the TensorIterator again), and ops like native_layer_norm whose
// CompositeExplicitAutograd kernel is a long decomposition of the CPU's fused kernel.
// Routing them straight to the fallback runs the CPU's own kernel once. Ops returning
// views keep their generic kernels.
namespace {
bool returnsView(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;
  }
  return false;
}
}  // namespace

void registerDirectFallbacks() {
  static std::unique_ptr<torch::Library> library;
  if (library) return;
  library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                             c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    const bool generic =
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
    if (!generic || returnsView(op->schema())) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&zeroCopyFallback>());
  }
  // Composite ops whose kernel chooses its implementation by device type (a DispatchStub
  // called directly, or a CPU/CUDA/XPU allow-list): on CPU views they run as on the CPU.
  // _grouped_mm (MoE experts) checks CUDA's 16-byte stride alignment off the CPU.
  for (const char* qualified : {"conj_physical_", "mode.values", "_grouped_mm"}) {
    library->impl(qualified, torch::CppFunction::makeFromBoxedFunction<&zeroCopyFallback>());
  }
}

}  // namespace neuron
