// Native op observer: one row per aten op that a TorchDispatchMode would see, recorded in C++ from
// an at::RecordFunction callback, with no Python per op (issue 48, item 1).
//
// RecordFunction fires at every Dispatcher::call/callBoxed: above autograd, for composite ops
// (aten::linear) and for the ops called inside other ops' kernels. A dispatch mode sits below
// autograd and sees each op once it crosses autograd, never the ops inside its kernel. The callback
// keeps exactly those with a per-thread stack of the RecordFunction scopes it is in. An op is "live"
// when a tensor argument carries an autograd key this thread does not exclude: it is dispatched to
// an autograd kernel, whose redispatch excludes those keys below it.
//   - an op called by a recorded op's kernel below autograd (not live) is hidden, and so is all it
//     calls; a live one is an op that recorded op's autograd kernel calls: recorded, before that op
//     if it had not gone below autograd yet (kDeferred), else after it;
//   - a CompositeImplicitAutograd op without an autograd kernel, called live, is transparent: it
//     decomposes above autograd, so the mode sees the ops it calls (not live: under inference mode
//     it reaches the mode itself); one with an autograd kernel too (linear, matmul, narrow, chunk)
//     waits (kPending) for the first op it calls: live, it decomposed; not live, it is recorded (a
//     factory, with no tensor to tell, is live where the thread excludes no autograd key);
//   - the engine's scope around a node's evaluation is transparent and marks the ops in it as
//     backward ops, with the sequence number of the node the engine holds as current (the ops of
//     the gradient hooks it runs before the apply too, and those of a node applied inside its apply,
//     as CopySlices applies an in-place op's node: a dispatch mode names ops after the node the
//     engine runs). The node's apply (a BACKWARD_FUNCTION scope) is not observed: while a callback
//     observes that scope, torch builds its name, the node's class demangled, at every apply;
//   - a clone of a conjugate or negative view that an op calls before going below autograd is the
//     math-bit fallback's: recorded before the op, which reads it in that argument's place;
//   - an op torch.autocast sends to an autocast kernel of its own (mm, bmm, addmm), live or not
//     (inference mode), is transparent: that kernel casts the arguments and calls the op again with
//     autocast excluded;
//   - RecordFunctions named by a string (optimizer steps, record_function blocks) are transparent;
//   - an op whose autograd kernel never redispatches (detach_), called live, is hidden;
//   - an op with no autograd kernel (a custom op registered for a backend, quantized::linear_dynamic)
//     goes below autograd at once through autograd's fallback, which leaves autograd live for what
//     its kernel calls: those calls are hidden as any kernel's;
//   - an op called while the thread excludes the Python key is hidden, with all it calls: no
//     dispatch mode sees it (torch.tensor(data) builds its tensor so: empty, to, detach_); so is one
//     called while torch's fake, proxy or functional mode is active: FakeTensorMode while Dynamo
//     compiles (which a capture mode ignoring compile internals lets through); and one called
//     inside a torch.func transform (vmap, grad), whose batched ops a mode sees as the plain ops
//     beneath (in_transform);
//   - an op called under a dispatch mode entered after the observer started (selective
//     checkpointing's, a user's) is transparent: a capture mode, below that mode, sees the calls its
//     handler makes with the mode popped, which are recorded as any;
//   - every other op is recorded: inputs at its start, outputs at its end, but for a c10d
//     collective's outputs, read once its Work completes, and memory a collective still writes, read
//     once final (see Collectives).
// A forward op's sequence number is the one the autograd node it makes gets (the dispatcher reads
// at::sequence_number::peek() when grad mode is on and an autograd key is in the key set), so a
// backward row links to its forward row by equal sequence numbers.
//
// Callbacks are thread-local RecordFunction callbacks: the autograd engine and at::launch carry
// them (ThreadLocalState) to the threads that run a graph task. On such a thread an op is recorded
// only inside a backward scope; on the thread that started the observer, always. Tensor subclasses
// (a Python key in the key set) and nested tensors are flagged, never read as such: their sizes may
// call into Python. A tensor with no strides (sparse, mkldnn) is described (dtype, shape, device), not
// read. Python describes a subclass instance at the op, and the callback reads it through the plain
// tensor holding its elements, as a dispatch mode does (find_subclasses). Undefined tensors and
// wrapped numbers are no tensor slots (None and numbers in Python): with value slots wanted they are
// values, as every non-tensor argument a mode is handed.
//
// The torch C++ API used here (record_function.h, Dispatcher.h, DispatchKeySet.h, TensorImpl.h,
// torch/library.h, autograd's get_current_node and AccumulateGrad::variable) is the same in torch
// 2.11.0, 2.13.0 and 2.14.1 at the source level (get_current_node returns a std::shared_ptr on
// 2.11, a c10::intrusive_ptr on 2.13 and 2.14: only its .get() is used); a version difference
// would live in the block below.
//
// Plain extern "C" entry points, loaded with ctypes: no Python.h, no pybind11 (a cold build of
// this file takes about half a minute of CPU, most of it the dispatcher's and autograd's headers;
// torch/extension.h would add pybind11 and torch's whole C++ API on top). The one
// thing Python cannot take through ctypes, tensors, it takes from an operator this library
// registers: torch.ops.torchdebug.observer_kept() (see Slots::kept). The few functions of Python's
// stable C API that read an op's Python frames are declared below, with opaque pointers; the
// interpreter that loads this library exports them.

#include <ATen/Parallel.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "address_map.h"

extern "C" {
int Py_IsInitialized();
int PyGILState_Ensure();  // PyGILState_STATE, an enum
void PyGILState_Release(int state);
int PyGILState_Check();
void* PyGILState_GetThisThreadState();  // PyThreadState*
void* PyEval_GetFrame();             // PyFrameObject*, borrowed
void* PyFrame_GetBack(void* frame);  // a new reference
void* PyFrame_GetCode(void* frame);  // PyCodeObject*, a new reference
int PyFrame_GetLineNumber(void* frame);
__attribute__((weak)) int PyFrame_GetLasti(void* frame);  // Python 3.11 on: null before
void Py_IncRef(void* object);
void Py_DecRef(void* object);
void* PyObject_GetAttrString(void* object, const char* name);  // a new reference, or null (an error set)
const char* PyUnicode_AsUTF8(void* text);
void PyErr_Clear();
void* PyErr_Occurred();                        // borrowed, or null
void PyErr_Fetch(void** type, void** value, void** traceback);  // takes the error set (nulls: none), clearing it
void PyErr_Restore(void* type, void* value, void* traceback);   // sets it again (steals the references)
void* PyObject_CallNoArgs(void* callable);     // a new reference, or null (an error set)
long long PyLong_AsLongLong(void* number);     // -1 with an error set on failure
void* PyLong_FromLongLong(long long number);   // a new reference, or null (an error set)
void* PyObject_Type(void* object);             // a new reference
void* PyObject_CallFunctionObjArgs(void* callable, ...);  // arguments ending in null; a new reference, or null (an error set)
}

namespace {

// ---- torch API touch points (identical in 2.11.0, 2.13.0, 2.14.1) ------------------------------

enum Kind : int8_t { kOp, kComposite, kMaybeComposite, kAutogradOnly, kNotOp, kNoAutograd };
// kComposite: a CompositeImplicitAutograd kernel and no autograd kernel: it decomposes above
// autograd. kMaybeComposite: both (aten::linear, matmul, narrow, chunk, max_pool2d: their autograd
// kernel may decompose or redispatch), decided by what runs inside it. kNotOp: a RecordFunction
// named by a string (the engine's "autograd::engine::evaluate_function: ...", optimizer steps).
// kAutogradOnly: an op whose autograd kernel does all it does, never reaching below autograd
// (detach_, in torch/csrc/autograd/VariableTypeManual.cpp): called live, no dispatch mode sees it.
// kNoAutograd: an op with no kernel of its own for autograd (quantized::linear_dynamic, a custom op
// registered for a backend only): autograd's fallback redispatches it below autograd without
// excluding autograd for what its kernel calls, so those calls are live, yet a dispatch mode sees
// the op and none of them.

Kind kind_of(const c10::OperatorName& name) {
  if (name.name == "aten::detach_" && name.overload_name.empty()) return kAutogradOnly;
  auto handle = c10::Dispatcher::singleton().findOp(name);
  if (!handle.has_value()) return kOp;
  bool autograd = handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd) ||
                  handle->hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU) ||
                  handle->hasKernelForDispatchKey(c10::DispatchKey::AutogradCUDA);
  if (!handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return autograd ? kOp : kNoAutograd;
  return autograd ? kMaybeComposite : kComposite;
}

// The keys of a call with these arguments that this thread does not exclude: its tensor arguments'.
// An autograd key among them sends the call to an autograd kernel (inside an autograd kernel's
// redispatch, and under inference mode, autograd keys are excluded): the call is live. An autocast
// key (torch.autocast on, for the tensors' device) sends it to the op's autocast kernel, if it has one.
c10::DispatchKeySet live_keys(c10::ArrayRef<const c10::IValue> values) {
  c10::DispatchKeySet keys;
  for (const auto& value : values) {
    if (value.isTensor()) {
      keys = keys | value.unsafeToTensorImpl()->key_set();
    } else if (value.isList()) {
      for (const auto& item : value.toListRef()) {
        if (item.isTensor()) keys = keys | item.unsafeToTensorImpl()->key_set();
      }
    }
  }
  return keys - c10::impl::tls_local_dispatch_key_set().excluded_;
}

// ---- what is recorded ---------------------------------------------------------------------------

enum Level : int { kEmpty = 0, kEmptyWithValues = 1, kRecord = 2, kModuleRows = 3 };
// kEmpty: callbacks that return at once (the cost of RecordFunction itself); kEmptyWithValues: the
// same, asking the dispatcher for inputs and outputs (its boxing); kRecord: the observer; kModuleRows:
// no callback, only the rows td_observer_module_row adds (level "module": no op is recorded).

enum SlotFlag : int8_t { kPlain = 0, kSubclass = 1, kNested = 2, kValue = 4, kLaidOut = 16 };
// kValue: a non-tensor argument or result (a number, a list of sizes, a dtype, None), as JSON text.
// kLaidOut: a tensor of a layout with no strides (sparse, mkldnn), kLaidOut plus the layout's code:
// described (dtype, shape, device), not read, as CaptureSession describes one.

// ---- non-tensor values, as a dispatch mode is handed them -----------------------------------------
// A dispatch mode gets an op's arguments from torch's parseIValuesToPyArgsKwargs: the positional
// arguments up to the last one that differs from its default, and the keyword-only ones that differ
// from theirs; a dtype, layout or memory format as its Python object, an undefined tensor as None,
// a wrapped number (the 2.0 of x.mul(2.0)) as the number. ArgFacts holds what that needs of the schema.

enum ValueType : int8_t { kOther, kDtype, kLayout, kMemoryFormat };

struct ArgFacts {
  bool kwarg_only = false;
  ValueType type = kOther;
  std::optional<c10::IValue> default_value;
};

struct OpArgs {
  std::vector<ArgFacts> inputs;
  std::vector<ValueType> outputs;
};

ValueType value_type(const c10::TypePtr& type) {
  auto kind = type->kind();
  if (kind == c10::TypeKind::OptionalType) kind = type->castRaw<c10::OptionalType>()->getElementType()->kind();
  if (kind == c10::TypeKind::ScalarTypeType) return kDtype;
  if (kind == c10::TypeKind::LayoutType) return kLayout;
  if (kind == c10::TypeKind::MemoryFormatType) return kMemoryFormat;
  return kOther;
}

OpArgs op_args(const c10::FunctionSchema& schema) {
  OpArgs args;
  for (const auto& argument : schema.arguments()) {
    args.inputs.push_back({argument.kwarg_only(), value_type(argument.real_type()), argument.default_value()});
  }
  for (const auto& result : schema.returns()) args.outputs.push_back(value_type(result.real_type()));
  return args;
}

void json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
}

// The texts of the finite doubles written last on this thread, by their bits (direct-mapped): an
// optimizer's step writes a few dozen values (its rates, betas, epsilon, this step's sizes) a
// thousand times, and formatting one costs several hundred instructions.
struct DoubleText {
  uint64_t bits = 0;
  uint8_t size = 0;  // 0: empty
  char text[31];
};
thread_local std::array<DoubleText, 64> double_texts;

// A double as JSON that Python reads back as the same float (never as an int).
void json_double(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "Infinity" : "-Infinity";
  } else {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    auto& known = double_texts[(bits * 0x9E3779B97F4A7C15ULL) >> 58];
    if (known.size == 0 || known.bits != bits) {
      char* text = known.text;
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
      auto* end = std::to_chars(text, text + 28, value).ptr;  // the shortest text that reads back as it (at most 24)
#else  // a library without floating-point to_chars (before GCC 11): 17 digits read back as well, slower
      auto* end = text + std::snprintf(text, 28, "%.17g", value);
#endif
      if (std::find_first_of(text, end, ".e", ".e" + 2) == end) end = std::copy_n(".0", 2, end);
      known.bits = bits;
      known.size = static_cast<uint8_t>(end - text);
    }
    out.append(known.text, known.size);
  }
}

// A complex number as {"complex": [real, imag]}: Python makes it complex again.
void json_complex(std::string& out, c10::complex<double> number) {
  out += "{\"complex\":[";
  json_double(out, number.real());
  out += ',';
  json_double(out, number.imag());
  out += "]}";
}

const char* layout_name(int64_t code) {
  switch (static_cast<c10::Layout>(code)) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    case c10::kJagged: return "torch.jagged";
    default: return "torch.layout";
  }
}

const char* memory_format_name(int64_t code) {
  switch (static_cast<c10::MemoryFormat>(code)) {
    case c10::MemoryFormat::Contiguous: return "torch.contiguous_format";
    case c10::MemoryFormat::Preserve: return "torch.preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "torch.channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "torch.channels_last_3d";
    default: return "torch.memory_format";
  }
}

// A wrapped number's value (a 0-dim CPU tensor made from a Python number): read, not dispatched.
void json_wrapped_number(std::string& out, const c10::TensorImpl* impl) {
  switch (impl->dtype().toScalarType()) {
    case c10::ScalarType::Double: json_double(out, *static_cast<const double*>(impl->data())); break;
    case c10::ScalarType::Long: out += std::to_string(*static_cast<const int64_t*>(impl->data())); break;
    case c10::ScalarType::Bool: out += *static_cast<const bool*>(impl->data()) ? "true" : "false"; break;
    case c10::ScalarType::ComplexDouble: json_complex(out, *static_cast<const c10::complex<double>*>(impl->data())); break;
    default: json_string(out, "<wrapped number>");
  }
}

// A tensor Python sees as one: not undefined (None), not a wrapped number (a Python number).
bool is_tensor(const c10::IValue& value) {
  if (!value.isTensor()) return false;
  auto* impl = value.unsafeToTensorImpl();
  return impl != c10::UndefinedTensorImpl::singleton() && !impl->is_wrapped_number();
}

// A list holding a tensor.
bool holds_tensor(const c10::IValue& value) {
  if (!value.isList()) return false;
  auto items = value.toListRef();
  return std::any_of(items.begin(), items.end(), is_tensor);
}

// A slot of an item of a list of lists (c10d's Tensor[][]): its arg is the argument's position plus
// the outer index plus one shifted by kOuterShift, its element the inner index (slot_walk.cpp's
// arg_code names it "position.outer.inner", as iter_slots does).
constexpr int kOuterShift = 8;

// A non-tensor IValue as JSON text; complex numbers as {"complex": [real, imag]} (Python makes them
// complex again), objects with no JSON form as their type's name.
void json_value(std::string& out, const c10::IValue& value, ValueType type) {
  if (value.isNone()) {
    out += "null";
  } else if (value.isTensor()) {
    auto* impl = value.unsafeToTensorImpl();
    if (impl == c10::UndefinedTensorImpl::singleton()) {
      out += "null";
    } else {
      json_wrapped_number(out, impl);
    }
  } else if (value.isBool()) {
    out += value.toBool() ? "true" : "false";
  } else if (value.isInt()) {
    auto code = value.toInt();
    if (type == kDtype) {
      json_string(out, std::string(c10::getDtypeNames(static_cast<c10::ScalarType>(code)).first));
    } else if (type == kLayout) {
      json_string(out, layout_name(code));
    } else if (type == kMemoryFormat) {
      json_string(out, memory_format_name(code));
    } else {
      out += std::to_string(code);
    }
  } else if (value.isDouble()) {
    json_double(out, value.toDouble());
  } else if (value.isSymInt()) {
    auto known = value.toSymInt().maybe_as_int();
    if (known.has_value()) {
      out += std::to_string(*known);
    } else {
      json_string(out, "<symbolic int>");
    }
  } else if (value.isComplexDouble()) {
    json_complex(out, value.toComplexDouble());
  } else if (value.isString()) {
    json_string(out, value.toStringRef());
  } else if (value.isDevice()) {
    json_string(out, value.toDevice().str());
  } else if (value.isList() || value.isTuple()) {
    out += '[';
    bool first = true;
    auto add = [&](const c10::IValue& item) {
      if (!first) out += ',';
      first = false;
      json_value(out, item, type);
    };
    if (value.isList()) {
      for (const auto& item : value.toListRef()) add(item);
    } else {
      for (const auto& item : value.toTupleRef().elements()) add(item);
    }
    out += ']';
  } else {
    json_string(out, "<" + value.tagKind() + ">");
  }
}

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// A weak reference an AddressMap holds (its entries are made empty first): to nothing until set.
template <typename T, typename Null = c10::detail::intrusive_target_default_null_type<T>>
struct Held {
  c10::weak_intrusive_ptr<T, Null> weak{c10::intrusive_ptr<T, Null>()};
};

// Whether `weak` refers to nothing (let go, or never set), not to a tensor freed since.
template <typename T, typename Null>
bool refers_to_nothing(const c10::weak_intrusive_ptr<T, Null>& weak) {
  return weak._unsafe_get_target() == Null::singleton();
}

template <typename T, typename Null>
void let_go(c10::weak_intrusive_ptr<T, Null>& weak) {
  weak = c10::weak_intrusive_ptr<T, Null>(c10::intrusive_ptr<T, Null>());
}

// Hold `weak` at `address` unless the map holds a reference there already (taken from `weak`), or
// `weak` refers to nothing (a sweep held the slot's already).
template <typename T, typename Null>
void hold_first(AddressMap<Held<T, Null>>& map, int64_t address, c10::weak_intrusive_ptr<T, Null>& weak) {
  if (refers_to_nothing(weak)) return;
  auto before = map.size();
  auto& held = map[address];
  if (map.size() != before) held.weak = std::move(weak);
}

// ---- statistics and fingerprints: stats.c's kernels, called on CPU tensors -----------------------
// Python hands over the entry points of the stats library it loaded (td_observer_use_stats,
// td_observer_use_fingerprints), so the sums are those of torchdebug.native.fused_stats bit for bit:
// the same code, the same walk of the tensor's memory (runs() below is fused_stats._runs, and
// ordered_runs() its _ordered_runs, the walk of stats_and_fingerprint), the same thread count.

using StatsKernel = int (*)(const void*, int, const int64_t*, const int64_t*, double*, int);
using StatsHashKernel = int (*)(const void*, int, const int64_t*, const int64_t*, const int64_t*, double*, uint64_t*, int);
using HashKernel = uint64_t (*)(const void*, int, const int64_t*, const int64_t*, const int64_t*, int);
constexpr int kStatsWidth = 8;  // min, max, sum, squares, nan, posinf, neginf, zeros
constexpr int kMaxDims = 16;
constexpr int kMaxWidth = 8;  // bytes an element, for the fingerprint alone (td_hash_w1 .. td_hash_w8)
// The dtypes stats.c sums, in the order td_observer_use_stats and td_observer_use_fingerprints take
// their entry points (bool is read as uint8: one byte, 0 or 1).
constexpr std::array<c10::ScalarType, 8> kSummedTypes = {
    c10::ScalarType::Float, c10::ScalarType::BFloat16, c10::ScalarType::Double, c10::ScalarType::Long,
    c10::ScalarType::Int,   c10::ScalarType::Short,    c10::ScalarType::Char,   c10::ScalarType::Byte};
std::array<std::atomic<StatsKernel>, kSummedTypes.size()> stats_kernels{};  // all null: no statistics
std::array<std::atomic<StatsHashKernel>, kSummedTypes.size()> stats_hash_kernels{};
std::array<std::atomic<HashKernel>, kMaxWidth + 1> hash_kernels{};  // by element size; all null: no fingerprints
std::atomic<bool> keep_unsummed{false};
// Kept tensors staged early (td_observer_stage_kept): Python's hook takes them (observer_stage_kept) and
// stages their statistics before an op writes the memory one of them is on, and once stage_bytes of
// them were kept since the last staging, instead of a copy of each before the write and all of them
// held to the drain. defer_cpu (task="tensor", tests): CPU tensors are kept as other devices' are, not read here.
std::atomic<void*> stage_hook{nullptr};  // PyObject*: a callable () -> None, held by Python
std::atomic<int64_t> stage_bytes{-1};    // -1: only before a write
std::atomic<int64_t> kept_bytes{0};      // of the tensors kept since the last staging
std::atomic<bool> defer_cpu{false};
thread_local bool stage_due = false;  // this thread's op starts once the kept tensors are staged (on_enter)
bool staging() { return stage_hook.load(std::memory_order_relaxed) != nullptr; }
std::atomic<bool> outputs_waiting{false};  // Slots::waiting holds outputs (the recorder's)

// Whether a kept tensor's elements are still on its storage: FSDP2's reshard resizes its all-gather
// buffers' storage to 0 bytes, with no op, under the parameters' views (reshards_next); a tensor on
// such memory is not read (its slot says it changed before the flush), never read through a freed pointer.
bool memory_held(const at::Tensor& tensor) {
  if (!tensor.has_storage() || tensor.numel() == 0) return true;
  int64_t last = tensor.storage_offset();
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) last += (tensor.size(dim) - 1) * tensor.stride(dim);
  auto nbytes = static_cast<int64_t>(tensor.unsafeGetTensorImpl()->unsafe_storage().nbytes());
  return nbytes >= (last + 1) * static_cast<int64_t>(tensor.itemsize());
}

// The index of dtype in kSummedTypes, -1 for one stats.c does not sum.
int summed_index(c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::Bool) dtype = c10::ScalarType::Byte;
  auto found = std::find(kSummedTypes.begin(), kSummedTypes.end(), dtype);
  return found == kSummedTypes.end() ? -1 : static_cast<int>(found - kSummedTypes.begin());
}

bool want_sums() { return stats_kernels[0].load(std::memory_order_relaxed) != nullptr; }

StatsKernel stats_kernel(c10::ScalarType dtype) {
  int index = summed_index(dtype);
  return index < 0 ? nullptr : stats_kernels[index].load(std::memory_order_relaxed);
}

StatsHashKernel stats_hash_kernel(c10::ScalarType dtype) {
  int index = summed_index(dtype);
  return index < 0 ? nullptr : stats_hash_kernels[index].load(std::memory_order_relaxed);
}

bool want_fingerprints() { return hash_kernels[1].load(std::memory_order_relaxed) != nullptr; }

// Sizes and strides, outer to inner, that visit every element once with an innermost stride of 1
// (dims of size 1 dropped, dims that continue each other merged, broadcast dims outermost); the
// number of dims, 0 when no such walk exists (fused_stats copies such a tensor: not done here).
int runs(const c10::TensorImpl* impl, int64_t* sizes, int64_t* strides) {
  if (impl->is_contiguous()) {
    sizes[0] = impl->numel();
    strides[0] = 1;
    return 1;
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  auto shape = impl->sizes();
  auto steps = impl->strides();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1) dims.emplace_back(steps[d], shape[d]);
  }
  std::stable_sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.first != 0, -a.first) < std::make_pair(b.first != 0, -b.first);
  });
  int ndim = 0;
  for (auto dim = dims.rbegin(); dim != dims.rend(); ++dim) {  // inner to outer
    if (ndim > 0 && dim->first == strides[ndim - 1] * sizes[ndim - 1]) {
      sizes[ndim - 1] *= dim->second;
    } else {
      if (ndim == kMaxDims) return 0;
      sizes[ndim] = dim->second;
      strides[ndim] = dim->first;
      ++ndim;
    }
  }
  if (ndim == 0 || strides[0] != 1) return 0;
  std::reverse(sizes, sizes + ndim);
  std::reverse(strides, strides + ndim);
  return ndim;
}

// runs(), where each dim also says how far one step along it moves in the row-major order of the
// elements (positions, the fingerprint's): dims merge only where they continue each other in memory
// and in that order (fused_stats._ordered_runs: ties of stride broken by the larger step first).
int ordered_runs(const c10::TensorImpl* impl, int64_t* sizes, int64_t* strides, int64_t* positions) {
  if (impl->is_contiguous()) {
    sizes[0] = impl->numel();
    strides[0] = 1;
    positions[0] = 1;
    return 1;
  }
  struct Dim {
    int64_t stride, size, position;
  };
  std::vector<Dim> dims;
  auto shape = impl->sizes();
  auto steps = impl->strides();
  int64_t logical = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1) dims.push_back({steps[d], shape[d], logical});
    logical *= shape[d];
  }
  std::reverse(dims.begin(), dims.end());
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
    return std::make_tuple(a.stride != 0, -a.stride, -a.position) < std::make_tuple(b.stride != 0, -b.stride, -b.position);
  });
  int ndim = 0;
  for (auto dim = dims.rbegin(); dim != dims.rend(); ++dim) {  // inner to outer
    if (ndim > 0 && dim->stride == strides[ndim - 1] * sizes[ndim - 1] && dim->position == positions[ndim - 1] * sizes[ndim - 1]) {
      sizes[ndim - 1] *= dim->size;
    } else {
      if (ndim == kMaxDims) return 0;
      sizes[ndim] = dim->size;
      strides[ndim] = dim->stride;
      positions[ndim] = dim->position;
      ++ndim;
    }
  }
  if (ndim == 0 || strides[0] != 1) return 0;
  std::reverse(sizes, sizes + ndim);
  std::reverse(strides, strides + ndim);
  std::reverse(positions, positions + ndim);
  return ndim;
}

// A TensorBase over a TensorImpl the caller holds, made and dropped without touching its reference
// count (an atomic add and subtract a slot): c10::MaybeOwnedTraits<TensorBase>'s borrow.
class Borrowed {
 public:
  explicit Borrowed(c10::TensorImpl* impl) : tensor_(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl)) {}
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed() { tensor_.unsafeReleaseTensorImpl(); }
  const at::TensorBase& operator*() const { return tensor_; }

 private:
  at::TensorBase tensor_;
};

// The TensorImpl address of the tensor a view's memory belongs to (autograd's _base: the first one,
// for views of views), or 0 for a tensor that is no view; `held` gets a weak reference to it. The
// tensor is borrowed, never held (a factory's binding checks that it holds its result alone).
int64_t view_base(c10::TensorImpl* impl, WeakImpl& held) {
  if (impl->autograd_meta() == nullptr) return 0;  // no autograd metadata: no view
  Borrowed borrowed(impl);
  const auto& tensor = *borrowed;
  if (!tensor.is_view()) return 0;
  held = WeakImpl(tensor._base().getIntrusivePtr());
  return reinterpret_cast<int64_t>(tensor._base().unsafeGetTensorImpl());
}

enum Taken : int { kSummed = 1, kHashed = 2 };

// What the callback reads of a plain (not a subclass, not nested) non-empty strided CPU tensor with
// data and without the negative bit: with statistics (use_stats), the sums of one of kSummedTypes
// (or bool) into out, and with fingerprints its fingerprint too, in the same pass (the walk
// stats_and_fingerprint takes, so the sums are the dispatch mode's with checksum=True); the
// fingerprint alone of one of another dtype of 1, 2, 4 or 8 bytes an element (the fingerprint reads
// bits; not conjugated), whose statistics torch ops take at the drain. What it does not take (memory
// no walk visits, other dtypes) the tensor is kept for. Returns the Taken bits.
[[gnu::noinline]] int take_values(const c10::TensorImpl* impl, double* out, int64_t* fingerprint) {
  if (!impl->is_cpu() || defer_cpu.load(std::memory_order_relaxed) || impl->layout() != c10::kStrided || impl->is_neg() ||
      impl->numel() == 0 || !impl->has_storage() || !impl->storage_initialized()) {
    return 0;
  }
  auto dtype = impl->dtype().toScalarType();
  bool prints = want_fingerprints();
  bool sums = want_sums();
  int64_t sizes[kMaxDims], strides[kMaxDims], positions[kMaxDims];
  if (sums && stats_kernel(dtype) != nullptr) {
    auto kernel = stats_kernel(dtype);
    if (!prints) {
      int ndim = runs(impl, sizes, strides);
      if (ndim == 0) return 0;
      kernel(impl->data(), ndim, sizes, strides, out, at::get_num_threads());
      return kSummed;
    }
    auto both = stats_hash_kernel(dtype);
    int ndim = both == nullptr ? 0 : ordered_runs(impl, sizes, strides, positions);
    if (ndim == 0) return 0;
    uint64_t value = 0;
    both(impl->data(), ndim, sizes, strides, positions, out, &value, at::get_num_threads());
    *fingerprint = static_cast<int64_t>(value);
    return kSummed | kHashed;
  }
  auto width = impl->itemsize();
  if (!prints || impl->is_conj() || c10::isQIntType(dtype) || width > kMaxWidth) return 0;
  auto hash = hash_kernels[width].load(std::memory_order_relaxed);
  int ndim = hash == nullptr ? 0 : ordered_runs(impl, sizes, strides, positions);
  if (ndim == 0) return 0;
  *fingerprint = static_cast<int64_t>(hash(impl->data(), ndim, sizes, strides, positions, at::get_num_threads()));
  return kHashed;
}

// What the callback read of each tensor since the last drain, by TensorImpl, given again while the
// tensor is at the same version over the same memory: most tensors are read twice, as an op's output
// and as the next op's input (the dispatch mode shares those by version too). An entry holds its
// TensorImpl weakly, so that its address names that tensor alone while it is cached; one freed since
// is read again. Inference tensors (no version) are read each time.
// Writes into each storage since the last drain, by the ops whose schemas write (note_writes): a
// read holds only while its storage saw no write since, for a tensor on it whose version counter is
// not the writer's (`p.data.mul_()`: `.data` is an alias with a version counter of its own, and a
// write through it leaves the parameter's version where it was). Held with reads_mutex.
AddressMap<uint64_t> storage_writes;  // by StorageImpl address

int64_t address(const void* pointer) { return reinterpret_cast<int64_t>(pointer); }

// ---- sweeps: the weak references of freed tensors let go before the drain -----------------------
// A weak reference keeps a freed TensorImpl's (or StorageImpl's) small allocation until it is let
// go, and glibc carves new small allocations out of freed large buffers: holding every slot's to the
// drain kept each freed buffer of a step from being used again (a chain of 8 MiB temporaries grew
// the heap by each one). So once sweep_after bytes of CPU tensors were recorded since the last
// sweep, the next op first lets go of the references of the tensors freed since (Recorder::sweep).
// Another tensor may then take such an address before the drain: slots name tensors by a key, the
// address with the number of times a sweep let it go in bits 48 to 62 (generations), so that a key
// names one tensor from its first slot until a drain reports it freed, as an address did. An address
// let go kLastGeneration times is held to the drain again, as one above 48 bits is (never seen on
// x86-64 or AArch64 user space: sweeps stop).
constexpr int kGenerationShift = 48;
constexpr int64_t kAddressBits = (int64_t{1} << kGenerationShift) - 1;
constexpr int64_t kLastGeneration = (int64_t{1} << 15) - 1;
AddressMap<int64_t> generations;  // by address, those let go by sweeps (recorder.mutex held)
bool sweeps_possible = true;      // false once an address above 48 bits was seen (recorder.mutex held)
std::atomic<int64_t> sweep_after{-1};  // td_observer_sweep_after: -1 never, 0 at every op (tests)
std::atomic<bool> sweep_due{false};
std::atomic<int64_t> stashes_in_use{0};  // of all threads (ThreadState::stashed): a drain prunes generations only when none is

// The key of a TensorImpl's or StorageImpl's address (0 stays 0), recorder.mutex held.
int64_t key_of(int64_t raw) {
  if (raw >> kGenerationShift != 0) {
    sweeps_possible = false;
    return raw;
  }
  if (generations.empty()) return raw;
  const auto* found = generations.find(raw);
  return found == nullptr ? raw : raw | found->second << kGenerationShift;
}

// A slot's address or key as a key: a key (bits above 48) stays as it is (a slot moved out of the
// recorder's and back: its tensor was alive meanwhile, so its address was not let go).
int64_t key_again(int64_t value) { return value >> kGenerationShift != 0 ? value : key_of(value); }

uint64_t writes_into(const c10::TensorImpl* impl) {
  if (storage_writes.empty() || !impl->has_storage()) return 0;
  const auto* found = storage_writes.find(address(impl->unsafe_storage().unsafeGetStorageImpl()));
  return found == nullptr ? 0 : found->second;
}

struct Read {
  Read() {}  // its arrays left as they are: read_values sets what holds() compares
  WeakImpl impl{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  int64_t version = 0;
  uint64_t writes = 0;  // writes_into its storage when read
  const void* data = nullptr;
  int ndim = 0;
  std::array<int64_t, kMaxDims> sizes, strides;
  int taken = 0;
  int64_t fingerprint = 0;
  std::array<double, kStatsWidth> sums;

  bool holds(const c10::TensorImpl* tensor, int64_t at_version) const {
    auto shape = tensor->sizes();
    auto steps = tensor->strides();
    return version == at_version && data == tensor->data() && static_cast<size_t>(ndim) == shape.size() && !impl.expired() &&
           writes == writes_into(tensor) &&
           std::equal(shape.begin(), shape.end(), sizes.begin()) && std::equal(steps.begin(), steps.end(), strides.begin());
  }
};
// The reads by TensorImpl address, as indices into read_pool; both held with reads_mutex. An entry
// forgotten leaves its Read in the pool until the drain clears both (the pool keeps its buffer).
std::mutex reads_mutex;
AddressMap<uint32_t> read_at;
std::vector<Read> read_pool;

void forget_read(const c10::TensorImpl* impl) { read_at.erase(address(impl)); }  // reads_mutex held

// Let go of the reads of tensors freed since (a sweep): an entry left refers to nothing, which holds
// for no tensor (Read::holds). Returns the reads walked.
size_t forget_dead_reads() {
  std::lock_guard<std::mutex> lock(reads_mutex);
  for (auto& read : read_pool) {
    if (read.impl.expired()) let_go(read.impl);
  }
  return read_pool.size();
}

void forget_reads() {
  std::lock_guard<std::mutex> lock(reads_mutex);
  read_at.clear();
  read_pool.clear();
  storage_writes.clear();
}

// A thread_local's address in a shared library takes a __tls_get_addr call, and a compiler that
// knows a reference is to a thread_local computes that address anew at each use (GCC did, through
// the clones it makes of functions always handed one: 43 calls in enter, about 100 an op in all, 8%
// of the callbacks' instructions). Bound through this call, which it cannot see into, the reference
// is held instead: each callback takes its thread's state once.
#if defined(__clang__)
#define TD_OPAQUE __attribute__((noinline, optnone))
#else
#define TD_OPAQUE __attribute__((noipa))
#endif
template <typename T>
TD_OPAQUE T& thread_ref(T& value) {
  return value;
}

// The compiled scopes this thread is in (compiled_scope): inductor's kernels write buffers there
// (a matmul's output in place with its bias and activation, a donated saved activation) with no aten
// op and no version moved, so a read there is neither given an earlier read nor kept for a later one.
// (A graph input it writes in place moves its version: AOT autograd counts that write.)
thread_local int compiled_scopes = 0;

// take_values, or what it gave for this tensor at this version since the last drain. One lock for
// the lookup, the read and the entry: the callbacks of two threads rarely read at once.
[[gnu::noinline]] int read_values(c10::TensorImpl* impl, double* out, int64_t* fingerprint) {
  bool cacheable = !impl->is_inference() && impl->is_cpu() && impl->layout() == c10::kStrided && impl->numel() > 0 &&
                   impl->has_storage() && impl->storage_initialized() && impl->dim() <= kMaxDims;
  if (!cacheable || compiled_scopes > 0) return take_values(impl, out, fingerprint);
  auto version = impl->version_counter().current_version();
  std::lock_guard<std::mutex> lock(reads_mutex);
  const auto* found = read_at.find(address(impl));
  if (found != nullptr && read_pool[found->second].holds(impl, version)) {
    const auto& read = read_pool[found->second];
    std::copy(read.sums.begin(), read.sums.end(), out);
    *fingerprint = read.fingerprint;
    return read.taken;
  }
  uint64_t writes = writes_into(impl);
  int taken = take_values(impl, out, fingerprint);
  if (found == nullptr) read_at[address(impl)] = static_cast<uint32_t>(read_pool.size());
  auto& read = found == nullptr ? read_pool.emplace_back() : read_pool[found->second];
  read.impl = WeakImpl::reclaim_copy(impl);
  read.version = version;
  read.writes = writes;
  read.data = impl->data();
  read.ndim = static_cast<int>(impl->dim());
  std::copy(impl->sizes().begin(), impl->sizes().end(), read.sizes.begin());
  std::copy(impl->strides().begin(), impl->strides().end(), read.strides.begin());
  read.taken = taken;
  read.fingerprint = *fingerprint;
  std::copy(out, out + kStatsWidth, read.sums.begin());
  return taken;
}

// Writes torch does not count in a tensor's version (BatchNorm's running statistics, a fused
// optimizer's tensors: ops with no ADInplaceOrView kernel), by TensorImpl: a slot's version adds
// them, as a dispatch mode's capture counts them (CaptureSession.wrote, ValueIds.wrote), so that a
// tensor read before such a write and after it holds two values. The weak reference keeps the
// address the tensor's alone; entries of freed tensors go at the drain, all at a new capture.
struct Unmoved {
  WeakImpl impl;
  int64_t writes;
};
std::mutex unmoved_mutex;
std::unordered_map<const c10::TensorImpl*, Unmoved> unmoved;
std::atomic<bool> any_unmoved{false};

int64_t unmoved_writes(const c10::TensorImpl* impl) {
  if (!any_unmoved.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(unmoved_mutex);
  auto found = unmoved.find(impl);
  return found == unmoved.end() ? 0 : found->second.writes;
}

// The version a slot of `impl` records: torch's, plus the writes it did not count.
int64_t slot_version(const c10::TensorImpl* impl) {
  return static_cast<int64_t>(impl->version_counter().current_version()) + unmoved_writes(impl);
}

void forget_unmoved(bool all) {
  std::lock_guard<std::mutex> lock(unmoved_mutex);
  for (auto entry = unmoved.begin(); entry != unmoved.end();) {
    entry = all || entry->second.impl.expired() ? unmoved.erase(entry) : std::next(entry);
  }
  any_unmoved.store(!unmoved.empty(), std::memory_order_relaxed);
}

std::atomic<bool> want_values{false};  // td_observer_want_values: record value slots

enum Grouped : int8_t { kGrouped = 1, kUnshards = 2 };  // OpInfo::grouped (Owners)

struct OpInfo {
  int32_t id;  // -1 for kNotOp
  Kind kind;
  const OpArgs* args = nullptr;  // its schema's facts (Recorder::args)
  bool frame_op = false;  // one of the ops whose frames tell checkpointing's own calls (td_observer_checkpoint)
  bool mutable_op = false;  // its schema writes an argument, or it writes one undeclared
  const std::vector<int16_t>* written = nullptr;  // the positions of the arguments it writes (Recorder::written)
  int16_t written_if = -1;  // the bool argument without which it writes nothing (BatchNorm's training)
  c10::DispatchKeySet autocast;  // the autocast keys it has a kernel for (mm, bmm, matmul, conv: torch.autocast's lists)
  bool collective = false;  // a c10d op: its outputs are read once its Work completes (Collectives)
  bool receives = false;    // c10d's recv_ and recv_any_source_: their outputs are their first argument
  bool writes_first = false;  // a c10d op writing its first argument's tensors (all but send, the barriers, check_for_nan)
  int16_t async_arg = -1;   // the position of its async_op argument (false: the caller waits for it at once)
  int8_t functional = 0;    // kFunctionalWrites: a _c10d_functional collective; kFunctionalWaited: its wait_tensor
  int8_t grouped = 0;       // kGrouped: a collective or an fsdp op, which an FSDP2 group may own; kUnshards: FSDP2's copy-in (Owners)
  bool detach = false;      // aten::detach: _make_subclass's own is one no dispatch mode sees (settle_detached)
};

// Ops that write arguments their schema does not mark written: BatchNorm's kernels update the
// running statistics (3, 4) in place when training (5) is true. capture/eager.py's
// _UNDECLARED_WRITES holds the same list.
bool undeclared_writes(const c10::OperatorName& name) {
  return name.overload_name.empty() && (name.name == "aten::native_batch_norm" || name.name == "aten::cudnn_batch_norm" ||
                                         name.name == "aten::miopen_batch_norm");
}

// Forget what was read of the tensors among `values` (an op that may write them is about to): a fused
// optimizer writes its tensors without moving their versions, so the next read takes them again.
void forget_reads_of(c10::ArrayRef<const c10::IValue> values) {
  std::lock_guard<std::mutex> lock(reads_mutex);
  for (const auto& value : values) {
    if (value.isTensor()) {
      forget_read(value.unsafeToTensorImpl());
    } else if (value.isList()) {
      for (const auto& item : value.toListRef()) {
        if (item.isTensor()) {
          forget_read(item.unsafeToTensorImpl());
        } else if (item.isList()) {  // c10d's Tensor[][]
          for (const auto& inner : item.toListRef()) {
            if (inner.isTensor()) forget_read(inner.unsafeToTensorImpl());
          }
        }
      }
    }
  }
}

// A c10d collective's outputs hold what it wrote, though no version moved: what was read of them, and
// of every tensor on their storages (a DDP bucket's views, the gradients themselves with
// gradient_as_bucket_view), is read again (slot_walk.cpp counts the same write at its outputs).
void collective_wrote(c10::ArrayRef<const c10::IValue> values) {
  std::lock_guard<std::mutex> lock(reads_mutex);
  std::function<void(const c10::IValue&)> wrote = [&](const c10::IValue& value) {
    if (value.isList()) {
      for (const auto& item : value.toListRef()) wrote(item);
    } else if (value.isTensor()) {
      auto* impl = value.unsafeToTensorImpl();
      forget_read(impl);
      if (impl->has_storage()) ++storage_writes[address(impl->unsafe_storage().unsafeGetStorageImpl())];
    }
  };
  for (const auto& value : values) wrote(value);
}

// ---- memory collectives still write: read once final -----------------------------------------------
// A _c10d_functional collective (what DTensor and tensor parallelism issue) returns a tensor the
// process group is still writing into; its values are final once _c10d_functional::wait_tensor ran
// on a tensor of its storage. As capture/collectives.py's PendingFunctional holds the dispatch
// mode's slots, every slot on such a storage (the outputs, what reads them before the wait) is kept,
// not read, until a wait_tensor on it ends: the drain hands them over after capture stopped and
// td_observer_finish_functional waited for the rest, so they are read once final (or say they
// changed since, where an op wrote them in place before the flush). The same holds for the outputs
// of a c10d collective whose Work has not completed (see Collectives), which an op may view or read
// meanwhile (a DDP bucket, viewed at the backward's end).
enum CollectiveWrite : int8_t { kFunctionalWrites = 1, kFunctionalWaited = 2, kCollectiveWrites = 3, kCollectiveDone = 4 };
std::mutex in_flight_mutex;  // taken after the recorder's, or alone
std::unordered_set<int64_t> in_flight_storages;  // the StorageImpl addresses collectives are writing (in flight)
std::vector<at::Tensor> functional_outputs;     // a tensor of each functional collective's, to wait on when capture stops
std::atomic<bool> in_flight_any{false};

bool in_flight(const c10::TensorImpl* impl) {
  if (!in_flight_any.load(std::memory_order_relaxed) || !impl->has_storage()) return false;
  std::lock_guard<std::mutex> lock(in_flight_mutex);
  return in_flight_storages.count(address(impl->unsafe_storage().unsafeGetStorageImpl())) != 0;
}

// The storages of `values` are being written (kFunctionalWrites: a functional collective's outputs;
// kCollectiveWrites: a c10d collective's, in lists and lists of lists), or are final
// (kFunctionalWaited: a wait_tensor's result; kCollectiveDone: the c10d collective's, completed).
void note_in_flight(c10::ArrayRef<const c10::IValue> values, int8_t what) {
  std::lock_guard<std::mutex> lock(in_flight_mutex);
  std::function<void(const c10::IValue&)> note = [&](const c10::IValue& value) {
    if (value.isList()) {
      for (const auto& item : value.toListRef()) note(item);
      return;
    }
    if (!is_tensor(value) || !value.unsafeToTensorImpl()->has_storage()) return;
    auto key = address(value.unsafeToTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
    if (what == kFunctionalWrites) {
      if (in_flight_storages.insert(key).second) functional_outputs.push_back(value.toTensor());
    } else if (what == kCollectiveWrites) {
      in_flight_storages.insert(key);
    } else {
      in_flight_storages.erase(key);
    }
  };
  for (const auto& value : values) note(value);
  in_flight_any.store(!in_flight_storages.empty(), std::memory_order_relaxed);
}

// ---- subclass instances: described by Python at the op, read through their plain tensor ------------
// A dispatch mode describes a subclass instance (a DTensor: FSDP2's sharded parameters and their
// optimizer states, tensor parallelism's) at the op and reads it through the plain tensor holding its
// elements (CaptureSession's _describe_subclass); an optimizer writes them in place right after. The
// observer cannot hold the instance for a later look: a hold counts in its use_count, which torch
// reads (AccumulateGrad steals a gradient nothing else holds, else clones it; a *_like op's binding
// makes its result a variable in place only while nothing else holds it, else it detaches it through
// the subclass). So at each op taking or returning one, before the recorder's lock is taken,
// Dynamo's frame callback, off while a hook runs (call_hook): torch's set_eval_frame and None, handed
// by Python (td_observer_use_eval_frame; null: nothing to turn off).
std::atomic<void*> eval_frame_setter{nullptr}, none_object{nullptr};

// Call `hook` on `argument` (null: on nothing), the GIL held, with Dynamo's frame callback off
// meanwhile, as torch.compiler.disable turns it off around what it wraps: where Dynamo runs a frame
// of compiled code eagerly with its callback on (one it failed to compile), it would compile each
// Python frame that starts in an op there, the hook and all it calls, as user code. The hook's
// result (a new reference), or null with its error cleared. (Not through torch.compiler.disable's
// wrapper: it would put a frame of its own between the owner hook and the frame it reads, its caller.)
// An error set when it is called (an op ending as a Python error unwinds it: RecordFunction's end
// callbacks run then) is put aside meanwhile and set again after: Python is never called with one set.
void* call_hook_now(void* hook, void* argument);

void* call_hook(void* hook, void* argument) {
  void *pending_type = nullptr, *pending_value = nullptr, *pending_traceback = nullptr;
  PyErr_Fetch(&pending_type, &pending_value, &pending_traceback);
  void* result = call_hook_now(hook, argument);
  if (pending_type != nullptr) PyErr_Restore(pending_type, pending_value, pending_traceback);
  return result;
}

void* call_hook_now(void* hook, void* argument) {
  void* setter = eval_frame_setter.load(std::memory_order_relaxed);
  void* prior = setter != nullptr ? PyObject_CallFunctionObjArgs(setter, none_object.load(std::memory_order_relaxed), nullptr) : nullptr;
  if (setter != nullptr && prior == nullptr) PyErr_Clear();  // (Dynamo stays as it was)
  void* result = argument != nullptr ? PyObject_CallFunctionObjArgs(hook, argument, nullptr) : PyObject_CallNoArgs(hook);
  if (result == nullptr) PyErr_Clear();  // a fault of the hook's: no Python is called with an error set
  if (prior != nullptr) {
    void* replaced = PyObject_CallFunctionObjArgs(setter, prior, nullptr);
    if (replaced != nullptr) {
      Py_DecRef(replaced);
    } else {
      PyErr_Clear();
    }
    Py_DecRef(prior);
  }
  return result;
}

// find_subclasses calls a hook of capture/native_records.py's with the GIL: Python describes the
// instance (once a drain: an address names one TensorImpl until the drain, Slots::alive) and returns
// the address of the plain TensorImpl the callback reads it through (0: none, not a CPU tensor), read
// with the slot where values are wanted (Slots::add). Ops the hook runs are hidden (ThreadState::in_hook).
std::atomic<void*> subclass_hook{nullptr};  // PyObject*: a callable (tensor) -> int, held by Python (td_observer_use_subclass_hook)
// For the slots added next, by each subclass instance's TensorImpl address: the plain TensorImpl it is
// read through (0: none), one entry per instance asked (an optimizer's foreach op takes hundreds).
thread_local AddressMap<int64_t> plain_of;

bool any_subclass(c10::ArrayRef<const c10::IValue> values) {
  auto subclass = [](const c10::IValue& value) {
    return value.isTensor() && value.unsafeToTensorImpl()->key_set().has(c10::DispatchKey::Python);
  };
  return std::any_of(values.begin(), values.end(), [&](const c10::IValue& value) {
    if (!value.isList()) return subclass(value);
    auto items = value.toListRef();
    return std::any_of(items.begin(), items.end(), subclass);
  });
}

void find_subclass(c10::TensorImpl* impl, void* hook, bool read) {
  if (!impl->key_set().has(c10::DispatchKey::Python) || plain_of.contains(address(impl))) return;
  plain_of[address(impl)] = 0;  // asked: once an op
  void* object = impl->pyobj_slot()->load_pyobj();
  if (object == nullptr) return;
  void* result = call_hook(hook, object);
  int64_t plain = 0;
  if (result != nullptr) {
    plain = PyLong_AsLongLong(result);
    Py_DecRef(result);
  }
  if (PyErr_Occurred() != nullptr) {  // a result that is no int: the instance is not described
    PyErr_Clear();
    plain = 0;
  }
  if (read) plain_of[address(impl)] = plain;
}

// Hand the subclass instances among `values` to the hook (see above); `in_hook` is set meanwhile.
void find_subclasses(c10::ArrayRef<const c10::IValue> values, bool& in_hook) {
  plain_of.clear();
  void* hook = subclass_hook.load(std::memory_order_relaxed);
  if (hook == nullptr || !any_subclass(values) || !Py_IsInitialized()) return;  // (checked by some callers already)
  if (PyGILState_Check() != 1 && PyGILState_GetThisThreadState() == nullptr) return;  // (no Python objects)
  bool read = want_sums() || want_fingerprints();
  auto gil = PyGILState_Ensure();
  in_hook = true;
  for (const auto& value : values) {
    if (value.isTensor()) {
      find_subclass(value.unsafeToTensorImpl(), hook, read);
    } else if (value.isList()) {
      for (const auto& item : value.toListRef()) {
        if (item.isTensor()) find_subclass(item.unsafeToTensorImpl(), hook, read);
      }
    }
  }
  in_hook = false;
  PyGILState_Release(gil);
}

struct PlainFound {  // forgets what find_subclasses found once its slots are added (a TensorImpl is not held)
  PlainFound() = default;
  PlainFound(const PlainFound&) = delete;
  PlainFound& operator=(const PlainFound&) = delete;
  ~PlainFound() { plain_of.clear(); }
};

c10::TensorImpl* plain_tensor_of(const c10::TensorImpl* impl) {
  const auto* found = plain_of.empty() ? nullptr : plain_of.find(address(impl));
  return found != nullptr ? reinterpret_cast<c10::TensorImpl*>(found->second) : nullptr;
}

struct Slots {
  std::vector<int64_t> row;
  std::vector<int8_t> io;  // 0 input, 1 output
  std::vector<int16_t> arg;
  std::vector<int16_t> element;  // index in a list argument, -1 outside lists
  std::vector<int8_t> dtype;     // c10::ScalarType
  std::vector<int8_t> flag;
  std::vector<int8_t> ndim;
  // The addresses below are keys (key_of) in the recorder's slots, addresses in a stash's: append
  // keys them, under the recorder's mutex, which a stash is filled without.
  std::vector<int64_t> value;  // the TensorImpl's address (Tensor._cdata in Python)
  std::vector<int64_t> version;
  std::vector<int64_t> storage;  // the StorageImpl's address (0: none, or not read)
  std::vector<int64_t> offset;   // the storage offset
  std::vector<int64_t> base;     // a view's: the TensorImpl address of the tensor whose memory it shares (0: none)
  std::vector<int64_t> shape;  // the slots' sizes, concatenated
  std::vector<int64_t> stride;  // the slots' strides, concatenated (ndim each, as shape)
  std::vector<int8_t> device_type;  // c10::DeviceType
  std::vector<int8_t> device_index;  // -1: none (the CPU)
  std::vector<int8_t> has_stats;
  std::vector<double> stats;  // kStatsWidth sums a slot (NaN where not taken)
  std::vector<int8_t> has_fingerprint;
  std::vector<int64_t> fingerprint;  // the fingerprint's 64 bits (0 where not taken)
  std::vector<std::string> text;     // a kValue slot's JSON text (empty for a tensor's)
  // With keep_unsummed: a reference to each plain non-empty tensor whose sums (or fingerprint) were
  // not taken here (another dtype or device), and its slot (an index into these columns), for Python to reduce at
  // its flush while the tensor is at the version recorded (a subclass instance is never held: Python
  // describes it at the op, find_subclasses; its plain tensor is kept as any). A factory's output is
  // held weakly until the next op starts (waiting: its index in kept): its Python binding makes its
  // result a variable in place only while nothing else holds it (make_variable), else it wraps a copy
  // of the TensorImpl.
  // A plain tensor is kept as an alias (its storage and sizes in a TensorImpl of capture's own, with a
  // version counter of its own) and held weakly itself: a strong hold would count in its use_count,
  // and a shared counter in its version counter's, which torch reads to decide (AccumulateGrad steals
  // a gradient nothing else holds, else clones it; make_variable wraps a factory's or a *_like
  // op's result in place only while nothing else holds it or its counter). kept_version: the
  // tensor's version then; the drain hands the alias over only while the tensor, if alive, is there
  // (a write an op is about to make replaced the alias by a copy, held without the tensor: its
  // kept_version is then kCopied).
  std::vector<at::Tensor> kept;
  std::vector<int64_t> kept_slot;
  std::vector<int64_t> kept_version;
  std::vector<WeakImpl> kept_original;
  std::vector<int64_t> kept_staged;  // its id among the tensors staged (observer_stage_kept), -1: not staged
  std::vector<std::pair<size_t, WeakImpl>> waiting;
  // Whether the outputs added now wait (a factory's: no tensor argument); another op's result is a
  // variable already and is held at once, so a temporary Python drops before the next op is read.
  bool outputs_wait = true;
  // A weak reference to each slot's TensorImpl (and base_alive: to a view's base), held until the
  // drain hands it to Recorder::seen: the allocator cannot put another tensor at an address while a
  // weak reference holds it, so from a tensor's first slot until the drain that reports it freed,
  // its address names it alone.
  std::vector<WeakImpl> alive;
  std::vector<WeakImpl> base_alive;  // the same for each view's base (the undefined tensor for none)
  // And to each plain slot's StorageImpl (empty for the others): a storage freed mid-step whose
  // address another took would pass for it (slot_walk.cpp's unwritten storages, storage_writes).
  std::vector<WeakStorage> storage_alive;
  // The recorder's slots only (keyed): the slots before swept have their references above held in
  // Recorder::seen and seen_storages already (Recorder::sweep); the bytes of the CPU tensors recorded since.
  bool keyed = false;
  size_t swept = 0;
  // observer_stage_kept's place in kept: the entries before stage_scan were looked at, and are staged,
  // of a kind never staged, or in stage_retry (those it left to a later staging: waiting, written,
  // in flight, not held; in order), so that a staging looks at the entries kept since the last one
  // and those alone, not at every entry of the step (a staging before each write: quadratic).
  size_t stage_scan = 0;
  std::vector<size_t> stage_retry;
  int64_t unswept_bytes = 0;
  size_t sweep_work = 0;  // the entries a sweep walks (holds, reads, kept originals), at the last sweep or drain

  // An undefined tensor (an optional tensor not given, an undefined gradient) is None in Python,
  // a wrapped number (the 2.0 of x.mul_(2.0)) a Python number: no slot.
  [[gnu::flatten]] void add(int64_t at_row, int8_t side, int16_t position, int16_t index, c10::TensorImpl* impl) {
    if (impl == c10::UndefinedTensorImpl::singleton() || impl->is_wrapped_number()) return;
    text.emplace_back();
    row.push_back(at_row);
    io.push_back(side);
    arg.push_back(position);
    element.push_back(index);
    value.push_back(keyed ? key_of(address(impl)) : address(impl));
    alive.push_back(WeakImpl::reclaim_copy(impl));
    dtype.push_back(static_cast<int8_t>(impl->dtype().toScalarType()));
    version.push_back(impl->is_inference() ? int64_t{-1} : slot_version(impl));
    int8_t kind = impl->key_set().has(c10::DispatchKey::Python) ? kSubclass
                  : impl->is_nested()                             ? kNested
                  : impl->layout() != c10::kStrided               ? static_cast<int8_t>(kLaidOut + static_cast<int8_t>(impl->layout()))
                                                                  : kPlain;
    flag.push_back(kind);
    auto at = stats.size();
    stats.resize(at + kStatsWidth, std::nan(""));
    // A subclass's, a nested or a sparse tensor's own memory is not its value: the TensorImpl stands for it.
    auto memory = kind == kPlain ? address(impl->unsafe_storage().unsafeGetStorageImpl()) : address(impl);
    storage.push_back(keyed ? key_of(memory) : memory);
    offset.push_back(kind == kPlain ? impl->storage_offset() : 0);
    base_alive.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
    auto viewed = kind == kPlain ? view_base(impl, base_alive.back()) : 0;
    base.push_back(keyed && viewed != 0 ? key_of(viewed) : viewed);
    if (keyed && kind == kPlain && impl->is_cpu()) count_unswept(impl->numel() * static_cast<int64_t>(impl->itemsize()));
    auto* storage_impl = kind == kPlain && impl->has_storage() ? impl->unsafe_storage().unsafeGetStorageImpl() : nullptr;
    storage_alive.push_back(storage_impl != nullptr ? WeakStorage::reclaim_copy(storage_impl) : WeakStorage(c10::intrusive_ptr<c10::StorageImpl>()));
    auto* plain = kind == kSubclass ? plain_tensor_of(impl) : nullptr;
    if (kind != kPlain && kind < kLaidOut && plain == nullptr) {  // (a subclass instance: Python described it at the op)
      add_unread();
      return;
    }
    if (plain != nullptr) impl = plain;  // read here through its plain tensor, whose sizes and device the columns take
    auto sizes = impl->sizes();
    ndim.push_back(static_cast<int8_t>(sizes.size()));
    shape.insert(shape.end(), sizes.begin(), sizes.end());
    auto device = impl->device();
    device_type.push_back(static_cast<int8_t>(device.type()));
    device_index.push_back(static_cast<int8_t>(device.index()));
    if (kind != kPlain && plain == nullptr) {  // no strides: read nothing
      stride.insert(stride.end(), sizes.size(), 0);
      has_stats.push_back(0);
      has_fingerprint.push_back(0);
      fingerprint.push_back(0);
      return;
    }
    auto steps = impl->strides();
    stride.insert(stride.end(), steps.begin(), steps.end());
    int64_t value = 0;
    // In flight: kept, read once final. A subclass's plain tensor is read anew each time: the
    // subclass's handlers write it below autograd, moving no version (read_values's entries hold).
    // Nothing is read (nor cached) where neither sums nor fingerprints are wanted: a structure dump.
    int taken = 0;
    if ((want_sums() || want_fingerprints()) && !in_flight(impl)) taken = plain != nullptr ? take_values(impl, stats.data() + at, &value) : read_values(impl, stats.data() + at, &value);
    has_stats.push_back(taken & kSummed ? 1 : 0);
    has_fingerprint.push_back(taken & kHashed ? 1 : 0);
    fingerprint.push_back(value);
    bool missing = (want_sums() && !(taken & kSummed)) ||
                   (want_fingerprints() && !(taken & kHashed));
    if (missing && impl->numel() > 0 && keep_unsummed.load(std::memory_order_relaxed)) {
      keep(impl, side == 1 && outputs_wait);
      // A subclass's handler writes its plain tensor below autograd, unseen (no write noted, no
      // version moved): a plain tensor kept is staged at once, before this op runs or the next.
      if (plain != nullptr && staging()) stage_due = true;
    }
  }

  // Note `bytes` of CPU tensors recorded: a sweep is due once sweep_after of them were since the last
  // one, and as many slots as a quarter of the entries it walks (its time stays linear in the slots).
  void count_unswept(int64_t bytes) {
    unswept_bytes += bytes;
    auto limit = sweep_after.load(std::memory_order_relaxed);
    if (limit == 0 || (limit > 0 && unswept_bytes >= limit && 4 * (row.size() - swept) >= sweep_work)) {
      sweep_due.store(true, std::memory_order_relaxed);
    }
  }

  // Keep the plain tensor of the slot just added for Python's flush (kept, kept_slot); `wait`: held
  // weakly until the next op starts (above).
  [[gnu::noinline]] void keep(c10::TensorImpl* impl, bool wait) {
    auto strong = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl);
    kept_version.push_back(current_version(impl));
    kept_original.emplace_back(strong);
    if (wait) {
      waiting.emplace_back(kept.size(), WeakImpl(strong));
      kept.emplace_back();
    } else {
      kept.emplace_back(held(std::move(strong)));
    }
    kept_slot.push_back(static_cast<int64_t>(row.size()) - 1);
    kept_staged.push_back(-1);
    auto limit = stage_bytes.load(std::memory_order_relaxed);
    if (limit >= 0 && staging()) {
      auto bytes = kept_bytes.fetch_add(impl->numel() * static_cast<int64_t>(impl->itemsize()), std::memory_order_relaxed);
      if (bytes + impl->numel() * static_cast<int64_t>(impl->itemsize()) >= limit) stage_due = true;
    }
    // Inside compiled code, inductor's kernels write buffers with no op (an extern kernel's output,
    // with its activation fused in; a donated buffer): a tensor kept there is staged as its op ends.
    if (compiled_scopes > 0 && staging()) stage_due = true;
  }

  static int64_t current_version(c10::TensorImpl* impl) {
    return impl->is_inference() ? -1 : static_cast<int64_t>(impl->version_counter().current_version());
  }

  // What is kept of a plain tensor: an alias.
  static at::Tensor held(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> strong) {
    auto counter = strong->is_inference() ? c10::VariableVersion(c10::VariableVersion::DISABLED) : c10::VariableVersion(0);
    // With the Python key excluded: under a dispatch mode the copy would call the mode's detach, an
    // op whose callback takes the recorder's lock this thread holds.
    c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
    return at::Tensor(strong->shallow_copy_and_detach(std::move(counter), /*allow_tensor_metadata_change=*/false));
  }

  // A non-tensor argument or result: a slot with no tensor (kValue), its JSON text in text.
  void add_value(int64_t at_row, int8_t side, int16_t position, int16_t index, const c10::IValue& item, ValueType type) {
    text.emplace_back();
    json_value(text.back(), item, type);
    row.push_back(at_row);
    io.push_back(side);
    arg.push_back(position);
    element.push_back(index);
    value.push_back(0);
    alive.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
    base_alive.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
    storage_alive.emplace_back(c10::intrusive_ptr<c10::StorageImpl>());
    dtype.push_back(-1);
    version.push_back(-1);
    flag.push_back(kValue);
    stats.resize(stats.size() + kStatsWidth, std::nan(""));
    storage.push_back(0);
    offset.push_back(0);
    base.push_back(0);
    add_unread();
  }

  // The columns of a slot whose tensor is not read (a subclass, a nested tensor, a value): no sizes,
  // no device, no sums, no fingerprint.
  void add_unread() {
    ndim.push_back(0);
    device_type.push_back(-1);
    device_index.push_back(-1);
    has_stats.push_back(0);
    has_fingerprint.push_back(0);
    fingerprint.push_back(0);
  }

  // One argument or result at position: a tensor, a list holding tensors (item by item), or a value.
  void add_one(int64_t at_row, int8_t side, int16_t position, const c10::IValue& value, ValueType type) {
    if (is_tensor(value)) {
      add(at_row, side, position, -1, value.unsafeToTensorImpl());
      return;
    }
    if (value.isList()) {
      auto items = value.toListRef();
      if (std::any_of(items.begin(), items.end(), [](const c10::IValue& item) { return is_tensor(item) || holds_tensor(item); })) {
        add_items(at_row, side, position, items, type, true);
        return;
      }
    }
    add_value(at_row, side, position, -1, value, type);
  }

  // The items of a list argument or result at position: tensors, the items of lists of tensors
  // (c10d's Tensor[][], by both indices: kOuterShift), and, with `values`, the others as values.
  void add_items(int64_t at_row, int8_t side, int16_t position, c10::ArrayRef<const c10::IValue> items, ValueType type, bool values) {
    for (size_t index = 0; index < items.size(); ++index) {
      const auto& item = items[index];
      if (is_tensor(item)) {
        add(at_row, side, position, static_cast<int16_t>(index), item.unsafeToTensorImpl());
      } else if (holds_tensor(item)) {
        add_items(at_row, side, static_cast<int16_t>(position | (index + 1) << kOuterShift), item.toListRef(), kOther, values);
      } else if (values) {
        add_value(at_row, side, position, static_cast<int16_t>(index), item, type);
      }
    }
  }

  // An op's arguments (side 0) or results (side 1). Without args (the fallback's measurements),
  // tensors only; with them, the values too, of the arguments a dispatch mode is handed (above).
  void add_all(int64_t at_row, int8_t side, c10::ArrayRef<const c10::IValue> values, const OpArgs* args = nullptr) {
    if (args == nullptr) {
      for (size_t position = 0; position < values.size(); ++position) {
        const auto& value = values[position];
        if (value.isTensor()) {
          add(at_row, side, static_cast<int16_t>(position), -1, value.unsafeToTensorImpl());
        } else if (value.isList()) {
          add_items(at_row, side, static_cast<int16_t>(position), value.toListRef(), kOther, false);
        }
      }
      return;
    }
    if (side == 1) {
      for (size_t position = 0; position < values.size(); ++position) {
        add_one(at_row, side, static_cast<int16_t>(position), values[position], position < args->outputs.size() ? args->outputs[position] : kOther);
      }
      return;
    }
    const auto& facts = args->inputs;
    auto count = std::min(values.size(), facts.size());
    auto is_default = [&](size_t position) {
      const auto& known = facts[position].default_value;
      return known.has_value() && *known == values[position];
    };
    size_t keywords = 0;  // the first keyword-only argument
    while (keywords < count && !facts[keywords].kwarg_only) ++keywords;
    size_t positional = keywords;  // the positional arguments handed over: up to the last non-default one
    while (positional > 0 && is_default(positional - 1)) --positional;
    for (size_t position = 0; position < count; ++position) {
      if (position >= positional && (position < keywords || is_default(position))) continue;
      add_one(at_row, side, static_cast<int16_t>(position), values[position], facts[position].type);
    }
  }

  // Append other's slots, as slots of row at_row (-1: the rows they hold).
  void append(const Slots& other, int64_t at_row) {
    for (size_t entry = 0; entry < other.kept.size(); ++entry) {
      kept.push_back(other.kept[entry]);
      kept_slot.push_back(static_cast<int64_t>(row.size()) + other.kept_slot[entry]);
      kept_version.push_back(other.kept_version[entry]);
      kept_original.push_back(other.kept_original[entry]);
      kept_staged.push_back(other.kept_staged[entry]);
    }
    if (at_row < 0) {
      row.insert(row.end(), other.row.begin(), other.row.end());
    } else {
      row.insert(row.end(), other.row.size(), at_row);
    }
    io.insert(io.end(), other.io.begin(), other.io.end());
    arg.insert(arg.end(), other.arg.begin(), other.arg.end());
    element.insert(element.end(), other.element.begin(), other.element.end());
    dtype.insert(dtype.end(), other.dtype.begin(), other.dtype.end());
    flag.insert(flag.end(), other.flag.begin(), other.flag.end());
    ndim.insert(ndim.end(), other.ndim.begin(), other.ndim.end());
    auto keys_from = value.size();
    value.insert(value.end(), other.value.begin(), other.value.end());
    alive.insert(alive.end(), other.alive.begin(), other.alive.end());
    base_alive.insert(base_alive.end(), other.base_alive.begin(), other.base_alive.end());
    storage_alive.insert(storage_alive.end(), other.storage_alive.begin(), other.storage_alive.end());
    version.insert(version.end(), other.version.begin(), other.version.end());
    storage.insert(storage.end(), other.storage.begin(), other.storage.end());
    offset.insert(offset.end(), other.offset.begin(), other.offset.end());
    base.insert(base.end(), other.base.begin(), other.base.end());
    shape.insert(shape.end(), other.shape.begin(), other.shape.end());
    stride.insert(stride.end(), other.stride.begin(), other.stride.end());
    device_type.insert(device_type.end(), other.device_type.begin(), other.device_type.end());
    device_index.insert(device_index.end(), other.device_index.begin(), other.device_index.end());
    has_stats.insert(has_stats.end(), other.has_stats.begin(), other.has_stats.end());
    stats.insert(stats.end(), other.stats.begin(), other.stats.end());
    has_fingerprint.insert(has_fingerprint.end(), other.has_fingerprint.begin(), other.has_fingerprint.end());
    fingerprint.insert(fingerprint.end(), other.fingerprint.begin(), other.fingerprint.end());
    text.insert(text.end(), other.text.begin(), other.text.end());
    if (keyed) {
      for (auto slot = keys_from; slot < value.size(); ++slot) {
        value[slot] = key_again(value[slot]);
        storage[slot] = key_again(storage[slot]);
        base[slot] = key_again(base[slot]);
      }
    }
  }

  // Move the slots of row at_row, the last ones, into other.
  void move_tail(int64_t at_row, Slots& other) {
    size_t first = row.size();
    while (first > 0 && row[first - 1] == at_row) --first;
    move_from(first, other);
  }

  // Move the slots from index first on into other (no output waiting: hold_waiting first).
  void move_from(size_t first, Slots& other) {
    swept = std::min(swept, first);  // (appended again, they are swept again: their references were let go)
    size_t dims = 0;
    for (size_t slot = first; slot < row.size(); ++slot) dims += static_cast<size_t>(ndim[slot]);
    auto move = [first](auto& from, auto& to, size_t width) {
      auto start = from.begin() + static_cast<std::ptrdiff_t>(first * width);
      to.insert(to.end(), start, from.end());
      from.erase(start, from.end());
    };
    move(row, other.row, 1);
    move(io, other.io, 1);
    move(arg, other.arg, 1);
    move(element, other.element, 1);
    move(dtype, other.dtype, 1);
    move(flag, other.flag, 1);
    move(ndim, other.ndim, 1);
    move(value, other.value, 1);
    move(alive, other.alive, 1);
    move(base_alive, other.base_alive, 1);
    move(storage_alive, other.storage_alive, 1);
    move(version, other.version, 1);
    move(storage, other.storage, 1);
    move(offset, other.offset, 1);
    move(base, other.base, 1);
    move(device_type, other.device_type, 1);
    move(device_index, other.device_index, 1);
    move(has_stats, other.has_stats, 1);
    move(stats, other.stats, kStatsWidth);
    move(has_fingerprint, other.has_fingerprint, 1);
    move(fingerprint, other.fingerprint, 1);
    move(text, other.text, 1);
    other.shape.insert(other.shape.end(), shape.end() - static_cast<std::ptrdiff_t>(dims), shape.end());
    shape.resize(shape.size() - dims);
    other.stride.insert(other.stride.end(), stride.end() - static_cast<std::ptrdiff_t>(dims), stride.end());
    stride.resize(stride.size() - dims);
    size_t keep = kept.size();
    while (keep > 0 && kept_slot[keep - 1] >= static_cast<int64_t>(first)) --keep;
    for (size_t entry = keep; entry < kept.size(); ++entry) {
      other.kept.push_back(std::move(kept[entry]));
      other.kept_slot.push_back(kept_slot[entry] - static_cast<int64_t>(first));
      other.kept_version.push_back(kept_version[entry]);
      other.kept_original.push_back(std::move(kept_original[entry]));
      other.kept_staged.push_back(kept_staged[entry]);
    }
    kept.resize(keep);
    kept_slot.resize(keep);
    kept_version.resize(keep);
    kept_staged.resize(keep);
    kept_original.erase(kept_original.begin() + static_cast<std::ptrdiff_t>(keep), kept_original.end());
    kept_dropped_from(keep);
  }

  // The entries of kept from `keep` on left (moved into other Slots, which looks at them anew).
  void kept_dropped_from(size_t keep) {
    stage_scan = std::min(stage_scan, keep);
    while (!stage_retry.empty() && stage_retry.back() >= keep) stage_retry.pop_back();
  }

  // The first `count` entries of kept left (handed over at a drain): the others' indices move down.
  void kept_dropped_before(size_t count) {
    stage_scan = stage_scan > count ? stage_scan - count : 0;
    size_t left = 0;
    for (auto entry : stage_retry) {
      if (entry >= count) stage_retry[left++] = entry - count;
    }
    stage_retry.resize(left);
  }

  // Hold the outputs waiting strongly (one freed already stays undefined: not read).
  void hold_waiting() {
    for (auto& [index, weak] : waiting) {
      auto strong = weak.lock();
      if (strong) kept[index] = held(std::move(strong));
    }
    waiting.clear();
  }

  void clear() {
    waiting.clear();
    for (auto* column :
         {&row, &value, &version, &storage, &offset, &base, &shape, &stride, &kept_slot, &kept_version, &kept_staged, &fingerprint}) {
      column->clear();
    }
    for (auto* column : {&io, &dtype, &flag, &ndim, &device_type, &device_index, &has_stats, &has_fingerprint}) {
      column->clear();
    }
    kept.clear();
    kept_original.clear();
    stats.clear();
    arg.clear();
    element.clear();
    alive.clear();
    base_alive.clear();
    storage_alive.clear();
    text.clear();
    swept = 0;
    unswept_bytes = 0;
    stage_scan = 0;
    stage_retry.clear();
  }
};

enum RowMark : int8_t { kGradOn = 1, kCheckpointNode = 2, kNoNode = 8, kFoundHidden = 16, kCompiled = 32 };
// kGradOn: grad mode was on at the op; kCheckpointNode: the node the engine runs is a reentrant
// checkpoint's (td_observer_checkpoint), whose ops re-run its region; kNoNode: a forward op with a
// sequence number made no node under it (no argument required grad), so the next node made takes
// that number (a custom autograd.Function's, applied next); kFoundHidden: a row found hidden after it
// was recorded (a call no dispatch mode sees, settle_detached), which the walk skips; kCompiled: an op
// of compiled code (compiled_scopes), whose slots the walk shares nothing with. (4 is native_recompute.py's.)

struct Row {
  int32_t op;
  int64_t seq;  // forward: the sequence number of the node the op makes; backward: of the node run
  int8_t backward;
  int64_t module;
  int64_t stack = -1;   // with stacks: the id of the Python frames an op was called from (see frames_wanted, python_frames)
  int8_t mark = 0;      // RowMark bits
  int64_t made = -1;    // the sequence number of the last autograd node made before the op
};

struct Recorder {
  Recorder() { slots.keyed = true; }
  std::mutex mutex;
  std::unordered_map<const char*, OpInfo> ops;  // keyed by the schema's name pointer: one per overload
  std::deque<std::string> names;                 // "aten.mm.default", by op id (they never move)
  std::deque<OpArgs> args;                       // by op id (they never move)
  std::deque<std::vector<int16_t>> written;      // by op id: the positions of the arguments it writes
  int64_t first_row = 0;  // op rows drained so far: slot rows hold absolute row numbers
  std::vector<int32_t> op;
  std::vector<int64_t> seq;
  std::vector<int8_t> backward;
  std::vector<int64_t> module;
  std::vector<int8_t> mark;
  std::vector<int64_t> made;
  std::vector<int64_t> stack;  // a stack id (python_frames), -1 for none
  Slots slots;
  // The TensorImpls of the slots drained (and of their views' bases), by address, held weakly until
  // they are freed; those freed are reported by the next drain (freed), after which their addresses
  // may be reused.
  AddressMap<Held<c10::TensorImpl, c10::UndefinedTensorImpl>> seen;
  AddressMap<Held<c10::StorageImpl>> seen_storages;  // the same for the slots' StorageImpls
  std::vector<int64_t> freed;  // TensorImpl and StorageImpl keys (never equal while both are held)
  std::vector<int64_t> retired;  // the keys sweeps let go of since the last drain, freed at the next

  // Hold the references of the slots from `from` to `to` in seen and seen_storages (a drain's, or a
  // sweep's), letting go of each slot's own.
  void hold_slots(size_t from, size_t to) {
    for (size_t slot = from; slot < to; ++slot) {
      if (slots.flag[slot] == kValue) continue;
      hold_first(seen, slots.value[slot], slots.alive[slot]);
      if (slots.base[slot] != 0) hold_first(seen, slots.base[slot], slots.base_alive[slot]);
      if (slots.flag[slot] == kPlain && slots.storage[slot] != 0) hold_first(seen_storages, slots.storage[slot], slots.storage_alive[slot]);
      let_go(slots.alive[slot]);
      let_go(slots.base_alive[slot]);
      let_go(slots.storage_alive[slot]);
    }
  }

  // A sweep (mutex held; see key_of): the slots' references since the last one held once each, then
  // those of the tensors and storages freed since let go, their keys retired (a drain reports them
  // freed), their addresses a generation further; and the other references the callbacks took of
  // freed tensors: their reads, their unmoved writes, the originals of kept tensors.
  void sweep() {
    hold_slots(slots.swept, slots.row.size());
    slots.swept = slots.row.size();
    slots.unswept_bytes = 0;
    if (sweeps_possible) {
      auto retire = [this](int64_t key, const auto& held) {
        auto generation = (key >> kGenerationShift) + 1;
        if (!held.weak.expired() || generation > kLastGeneration) return false;  // (the last: held to the drain)
        auto& next = generations[key & kAddressBits];
        next = std::max(next, generation);
        retired.push_back(key);
        return true;
      };
      seen.erase_if(retire);
      seen_storages.erase_if(retire);
    }
    slots.sweep_work = seen.size() + seen_storages.size() + forget_dead_reads() + slots.kept_original.size();
    forget_unmoved(false);
    for (auto& original : slots.kept_original) {
      if (original.expired()) let_go(original);  // (the drain hands a kept tensor over the same when it is freed)
    }
  }

  int64_t add_row(Row&& row) {  // mutex held
    op.push_back(row.op);
    seq.push_back(row.seq);
    backward.push_back(row.backward);
    module.push_back(row.module);
    mark.push_back(row.mark);
    made.push_back(row.made);
    stack.push_back(row.stack);
    return first_row + static_cast<int64_t>(op.size()) - 1;
  }

  Row pop_row() {  // mutex held: the last row, taken out
    Row row{op.back(), seq.back(), backward.back(), module.back(), stack.back(), mark.back(), made.back()};
    op.pop_back();
    seq.pop_back();
    backward.pop_back();
    module.pop_back();
    mark.pop_back();
    made.pop_back();
    stack.pop_back();
    return row;
  }
};

std::atomic<bool> want_stacks{false};
std::atomic<bool> positions_are_lines{PyFrame_GetLasti == nullptr};

// The distinct stacks taken so far: each whether its positions are lines, then the (code object,
// position) of its frames, innermost first, by id (ids stay: a drain hands ids, and Python
// symbolizes only the stacks new since). A position is the offset of the frame's last instruction
// (PyFrame_GetLasti, as torch's CapturedTraceback takes it), or its line (PyFrame_GetLineNumber,
// which reads the line table at each call) on Python 3.10, which has no PyFrame_GetLasti. The code
// objects of a stack are held from its first sight on (as many as the program has call sites of
// ops), so an address names one code object.
struct Stacks {
  struct Hash {
    size_t operator()(const std::vector<int64_t>& key) const {
      uint64_t hash = 1469598103934665603ull;
      for (auto word : key) hash = (hash ^ static_cast<uint64_t>(word)) * 1099511628211ull;
      return static_cast<size_t>(hash);
    }
  };
  std::mutex mutex;  // taken with the GIL held, never the other way round
  std::unordered_map<std::vector<int64_t>, int64_t, Hash> ids;
  std::deque<std::vector<int64_t>> frames;  // by id: code, position, code, position, ...
};
Stacks stacks;

// Activation checkpointing, as td_observer_checkpoint describes it: the node class of a reentrant
// region, and the ops (detach, empty) whose frames tell checkpoint's own calls from the user's.
std::string reentrant_node;
std::vector<std::string> frame_ops;

// py_frames.c's td_frames_take, handed over by td_observer_use_frames: the calling thread's frames
// read without the GIL (null: through Python's C API, as on Python 3.10).
using FramesTake = int64_t (*)(int64_t*, int64_t);
std::atomic<FramesTake> frames_take{nullptr};

// The id of the stack `key` holds (whether its positions are lines, then code and position of each
// frame, innermost first), and whether it is new: a new stack keeps its code objects, whose
// references the caller takes (known ones: lets go).
std::pair<int64_t, bool> intern_stack(const std::vector<int64_t>& key) {
  std::lock_guard<std::mutex> lock(stacks.mutex);
  auto found = stacks.ids.find(key);
  if (found != stacks.ids.end()) return {found->second, false};
  auto id = static_cast<int64_t>(stacks.frames.size());
  stacks.ids.emplace(key, id);
  stacks.frames.push_back(key);
  return {id, true};
}

// The frames through py_frames.c (offsets, not lines): no GIL but for a new stack's references
// (the frames hold their code objects until the op returns). -1 where it reads none (a thread with
// no Python thread state): the caller asks Python's C API.
int64_t walked_frames(FramesTake take, std::vector<int64_t>& key) {
  // Room for as many frames as the last stack of this thread had (at least 64): a steady depth grows
  // nothing, and one deep stack seen once leaves no large buffer to fill at every op.
  auto room = std::max<int64_t>(key.empty() ? 0 : static_cast<int64_t>(key.size() - 1) / 2, 64);
  key.resize(1 + 2 * static_cast<size_t>(room));
  auto count = take(key.data() + 1, room);
  if (count > room) {
    key.resize(1 + 2 * static_cast<size_t>(count));
    count = take(key.data() + 1, count);
  }
  if (count < 0) return -1;
  key[0] = 0;
  key.resize(1 + 2 * static_cast<size_t>(count));
  auto [id, fresh] = intern_stack(key);
  if (fresh) {
    auto gil = PyGILState_Ensure();
    for (size_t at = 1; at < key.size(); at += 2) Py_IncRef(reinterpret_cast<void*>(key[at]));
    PyGILState_Release(gil);
  }
  return id;
}

// The Python frames the op being recorded was called from, as an id of Stacks, when wanted
// (frames_wanted); -1 otherwise. It takes the GIL (but through py_frames.c, for a known stack):
// never called with the recorder's mutex held. A thread Python never ran on (an autograd device
// thread) has no frames: it takes no GIL there, as torch's gather does not
// (CapturedTraceback::Python::canGather, torch 2.11 through 2.14).
int64_t python_frames(bool wanted) {
  if (!wanted || !Py_IsInitialized()) return -1;
  thread_local std::vector<int64_t> stack_key;
  auto& key = thread_ref(stack_key);
  bool lines = positions_are_lines.load(std::memory_order_relaxed);
  auto take = frames_take.load(std::memory_order_relaxed);
  if (take != nullptr && !lines) {
    auto id = walked_frames(take, key);
    if (id >= 0) return id;
  }
  key.assign(1, lines ? 1 : 0);
  bool python_thread = PyGILState_Check() == 1 || PyGILState_GetThisThreadState() != nullptr;
  auto gil = python_thread ? PyGILState_Ensure() : 0;
  void* frame = python_thread ? PyEval_GetFrame() : nullptr;  // borrowed; each PyFrame_GetBack and PyFrame_GetCode a new reference
  if (frame != nullptr) Py_IncRef(frame);
  while (frame != nullptr) {
    key.push_back(reinterpret_cast<int64_t>(PyFrame_GetCode(frame)));
    key.push_back(lines ? PyFrame_GetLineNumber(frame) : PyFrame_GetLasti(frame));
    void* back = PyFrame_GetBack(frame);
    Py_DecRef(frame);
    frame = back;
  }
  auto [id, fresh] = intern_stack(key);
  if (!fresh) {
    for (size_t at = 1; at < key.size(); at += 2) Py_DecRef(reinterpret_cast<void*>(key[at]));
  }
  if (python_thread) PyGILState_Release(gil);
  return id;
}

Recorder recorder;
std::string drained_texts;  // the distinct JSON texts of the value slots drained last, each ended by a NUL
std::vector<at::Tensor> handed;  // the kept tensors of the slots drained last, for observer_kept()
int64_t staged_count = 0;  // kept tensors staged so far (observer_stage_kept): the next one's id; with recorder.mutex
int64_t stage_looked = 0;  // kept entries the stagings looked at so far (td_observer_stage_looked); with recorder.mutex
std::atomic<int64_t> write_looked{0};  // kept entries the checks before writes looked at so far (td_observer_write_looked)
// What observer_stage_kept knew of each tensor it handed over last, kFactsWidth a tensor: its
// slot's key and version, its base's key (0: none), whether a later slot of the same key and
// version holds the same values (a plain tensor outside compiled code: inductor's kernels and a
// subclass's handlers write unseen), the collectives' writes into its storage so far (they move
// no version); then where its elements are, for a kernel to read them without Python asking the
// tensor: its data's address, its element count, its ScalarType code, its device (the type's code
// << 8 | the index + 1) and flags: 1 its elements fill one span with none twice (contiguous or
// permuted), 2 in their own order (contiguous); the address 0 for a subclass or a tensor without
// memory to read.
// td_observer_staged_facts copies them out; with recorder.mutex.
constexpr size_t kFactsWidth = 10;
std::vector<int64_t> staged_facts;
// What a staging reads once: the values of a slot's key at a version, with the collectives' writes
// into its storage so far (they move no version). A later kept tensor of a staging found here holds
// the same values (same_values above): it takes the id of the tensor handed over for them, and is not
// handed over itself (its slots share what that one gives). Within one staging only, where each
// would read the same memory now: between two, a write the observer does not see (a collective's
// into an allocation, FSDP2's copy-in) may change it at the same version.
struct StagedValues {
  int64_t key = 0;
  int64_t version = 0;
  int64_t writes = 0;
  bool operator==(const StagedValues&) const = default;
};
template <>
struct MapKey<StagedValues> {  // no slot's key is INT64_MIN
  static StagedValues empty() { return StagedValues{INT64_MIN}; }
  static bool is_empty(const StagedValues& values) { return values.key == INT64_MIN; }
  static uint64_t hash(const StagedValues& values) {
    uint64_t hash = static_cast<uint64_t>(values.key) * 0x9E3779B97F4A7C15ULL;
    return (hash ^ static_cast<uint64_t>(values.version)) * 0x100000001B3ULL + static_cast<uint64_t>(values.writes);
  }
};
AddressMap<int64_t, StagedValues> staged_values;  // the staged id of each: of this staging; with recorder.mutex
// The module context of the rows recorded from now on. Python stores into it at each module call
// (NativeObserver.set_module: ctypes writes the 8 bytes at td_observer_module_context), a seventh of a
// foreign call's cost; an aligned 8-byte store is what a relaxed store of this lock-free atomic is.
std::atomic<int64_t> module_context{-1};
static_assert(std::atomic<int64_t>::is_always_lock_free && sizeof(std::atomic<int64_t>) == sizeof(int64_t) &&
              alignof(std::atomic<int64_t>) == alignof(int64_t));

// ---- collectives: outputs read once their Work completes ------------------------------------------
// A c10d op (dist.all_reduce's c10d::allreduce_) only starts its collective: its outputs hold other
// ranks' values once the Work it returns completes. As capture/collectives.py's PendingCollectives
// does for the dispatch mode, its inputs are read at its start and its outputs the first time an op
// starts after the Work completed (or after the op, when the caller waits for it: async_op false),
// unless that op runs inside torch.distributed's Python (gloo completes some collectives inside
// wait() with ops of its own); the rest when capture stops (td_observer_finish_collectives waits
// for them). A collective's output slots thus follow the slots of the ops that ran meanwhile, as the
// dispatch mode's records do. Whether a Work completed, and the wait, are c10d_work.cpp's (handed
// over by td_observer_use_works): without them every collective's outputs are read at its end.
using WorkCall = int (*)(const void*);
std::atomic<WorkCall> work_completed{nullptr}, work_wait{nullptr};

struct PendingCollective {
  int64_t row;
  std::vector<c10::IValue> outputs;  // what the dispatch mode records: the results that are no Work
  std::vector<c10::IValue> works;
  bool waited;  // the caller waits for it before it dispatches anything else
  const OpArgs* args;  // with value slots wanted: its schema's facts
};
std::mutex collectives_mutex;  // taken after the recorder's, or alone; never the other way round
std::vector<PendingCollective> pending_collectives;
std::atomic<bool> collectives_pending{false};
std::string distributed_dir;  // torch.distributed's folder, as a code object's co_filename starts (td_observer_use_works)

// Whether the Python frames the op runs under include torch.distributed's code. Each code object
// is judged once, under the GIL, and held meanwhile (an address names one code object).
bool inside_torch_distributed() {
  if (distributed_dir.empty() || !Py_IsInitialized()) return false;
  if (PyGILState_Check() != 1 && PyGILState_GetThisThreadState() == nullptr) return false;  // (no Python frames)
  static std::unordered_map<void*, bool> judged;  // the GIL held
  auto gil = PyGILState_Ensure();
  bool inside = false;
  void* frame = PyEval_GetFrame();
  if (frame != nullptr) Py_IncRef(frame);
  while (frame != nullptr) {
    void* code = PyFrame_GetCode(frame);
    auto found = judged.find(code);
    if (found == judged.end()) {
      void* file = PyObject_GetAttrString(code, "co_filename");
      const char* text = file != nullptr ? PyUnicode_AsUTF8(file) : nullptr;
      if (text == nullptr) PyErr_Clear();
      found = judged.emplace(code, text != nullptr && std::strncmp(text, distributed_dir.c_str(), distributed_dir.size()) == 0).first;
      if (file != nullptr) Py_DecRef(file);
      Py_IncRef(code);
    }
    inside = found->second;
    Py_DecRef(code);
    void* back = inside ? nullptr : PyFrame_GetBack(frame);
    Py_DecRef(frame);
    frame = back;
  }
  PyGILState_Release(gil);
  return inside;
}

// Read the outputs of the collectives whose Work completed (all of them, waiting for each, when
// `finish`). Called with no lock held: it takes the GIL, and a wait may run ops.
void complete_collectives(bool finish) {
  if (!finish && inside_torch_distributed()) return;
  std::vector<PendingCollective> ready;
  {
    std::lock_guard<std::mutex> lock(collectives_mutex);
    auto completed = work_completed.load(std::memory_order_relaxed);
    std::vector<PendingCollective> still;
    for (auto& entry : pending_collectives) {
      bool done = finish || entry.waited || completed == nullptr ||
                  std::all_of(entry.works.begin(), entry.works.end(), [&](const c10::IValue& work) { return completed(&work) != 0; });
      (done ? ready : still).push_back(std::move(entry));
    }
    pending_collectives = std::move(still);
    collectives_pending.store(!pending_collectives.empty(), std::memory_order_relaxed);
  }
  if (ready.empty()) return;
  if (auto wait = work_wait.load(std::memory_order_relaxed); finish && wait != nullptr) {
    for (const auto& entry : ready) {  // every rank issued them: they complete
      for (const auto& work : entry.works) wait(&work);
    }
  }
  for (const auto& entry : ready) {  // c10d's schemas mark no write: what was read of them at its start is gone
    collective_wrote(c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()));
    note_in_flight(c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()), kCollectiveDone);
  }
  std::lock_guard<std::mutex> lock(recorder.mutex);
  recorder.slots.outputs_wait = false;
  for (const auto& entry : ready) {
    recorder.slots.add_all(entry.row, 1, c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()), entry.args);
  }
}

// A c10d op's end (the recorder's mutex held): its outputs wait for its Work, or are read now when
// it returned none.
void end_collective(int64_t at_row, std::pair<bool, c10::IValue>&& call, const std::vector<c10::IValue>& results, const OpArgs* args) {
  PendingCollective entry{at_row, {}, {}, call.first, args};
  for (const auto& result : results) (result.isObject() ? entry.works : entry.outputs).push_back(result);
  if (!call.second.isNone()) entry.outputs.assign(1, std::move(call.second));  // recv_: the list it received into
  if (entry.works.empty() || work_completed.load(std::memory_order_relaxed) == nullptr) {
    collective_wrote(c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()));
    recorder.slots.outputs_wait = false;
    recorder.slots.add_all(at_row, 1, c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()), args);
    return;
  }
  note_in_flight(c10::ArrayRef<const c10::IValue>(entry.outputs.data(), entry.outputs.size()), kCollectiveWrites);
  std::lock_guard<std::mutex> lock(collectives_mutex);
  pending_collectives.push_back(std::move(entry));
  collectives_pending.store(true, std::memory_order_relaxed);
}

// Gradient accumulations: the context (NativeObserver.set_module's numbering) of each parameter the
// capture names, by its TensorImpl (td_observer_parameters: at the start, and as a capture with no
// model meets its top-level modules). The
// engine's evaluation of a parameter's AccumulateGrad node (its gradient hooks, the accumulation,
// its post hooks: DDP's copy into a bucket, an optimizer stepped in the backward) runs in the
// parameter's context, on the thread that evaluates it, as a dispatch mode names those ops after the
// node running. One lookup per accumulation, in place of Python hooks made again each step.
std::mutex parameters_mutex;
std::unordered_map<const c10::TensorImpl*, int64_t> parameter_context;
constexpr char kAccumulateGrad[] = "AccumulateGrad";
at::CallbackHandle handle = 0;
std::atomic<bool> modules_only{false};  // started at kModuleRows: module rows, no callback (handle 0)
std::thread::id owner;
std::atomic<int> level{kRecord};

constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function: ";
// The engine's scope around a node's evaluation: the node's apply (a BACKWARD_FUNCTION scope), then
// the reduction of each gradient to its input's shape (validate_outputs: sum_to) and its
// accumulation into the next nodes' input buffers. Ops in it are that node's backward ops.

enum FrameKind : int8_t { kHidden, kRecorded, kPending, kDeferred, kTransparent, kBackward, kModeCall };
// kRecorded: a row; what it calls below autograd is hidden. kPending: a kMaybeComposite op whose row
// waits in a stash until what runs inside it tells whether it decomposed. kDeferred: a recorded op
// whose autograd kernel called an op before its redispatch (an in-place op saving self.clone() for
// its backward): a dispatch mode sees that op first, so the row moves to a stash and is recorded
// again once the op goes below autograd (its first op called there) or ends. kModeCall: an op called
// under a dispatch mode entered after the observer started, transparent, its handler's calls recorded
// (ThreadState::mode_calls).

struct Frame {
  FrameKind kind;
  bool live;     // called with an autograd key live
  bool below;    // kRecorded: it called an op below autograd (its kernel runs)
  int64_t row;   // kRecorded: its row
  const OpArgs* args = nullptr;  // kRecorded with value slots wanted: its schema's facts
  bool frame_op = false;         // kPending: its op is a frame op (frames_wanted)
  bool returns = false;          // kPending, kDeferred: its schema has results
  bool factory = false;          // kPending, kRecorded: no tensor argument (its outputs wait: Slots::outputs_wait)
  int32_t writes = -1;           // kPending, kRecorded: where its written tensors start in ThreadState::writes
  bool accumulation = false;     // kBackward: the evaluation of a named parameter's AccumulateGrad
  int8_t materializes = 0;       // kRecorded, kDeferred: its arguments with a math bit not yet cloned (math_bit_clone)
  bool math_bits = false;        // it took an entry of ThreadState::math_bit_calls
  const c10::TensorImpl* cloned = nullptr;  // kRecorded: the argument of its parent the math-bit fallback clones (math_bit_clone)
  bool collective = false;  // kRecorded: a c10d op, its call in ThreadState::collective_calls
  int8_t functional = 0;    // kRecorded: OpInfo::functional
  bool detach = false;      // kRecorded: a detach of a plain tensor (settle_detached)
  bool compiled = false;    // a compiled scope (compiled_scope): counted in compiled_scopes while open
  uint64_t unwritten_inputs = 0;  // kRecorded, task="overflow_check": its input slots on unwritten memory (watch::unwritten_inputs)
};

// Whether an op called with `inputs` is a factory: no tensor argument, alone or in a list.
bool no_tensor_argument(c10::ArrayRef<const c10::IValue> inputs) {
  return std::none_of(inputs.begin(), inputs.end(), [](const c10::IValue& value) {
    if (is_tensor(value)) return true;
    if (!value.isList()) return false;
    auto items = value.toListRef();
    return std::any_of(items.begin(), items.end(), is_tensor);
  });
}

struct Stash {
  Row row;
  Slots slots;  // row numbers left as they were: set again when appended
};

struct ThreadState {
  std::vector<Frame> frames;
  std::vector<int64_t> node_seq;  // sequence numbers of the backward scopes
  std::vector<int8_t> node_checkpoint;  // for each: kCheckpointNode, or 0
  int64_t frames_node = INT64_MIN;  // the node of the last backward row with grad mode on or a frame op
  std::vector<Stash> stashes;     // of the kPending and kDeferred frames, innermost last
  size_t stashed = 0;             // stashes in use (the vector keeps its buffers)
  std::vector<std::pair<c10::TensorImpl*, int64_t>> writes;  // the tensors open ops write, with their versions then
  std::vector<int64_t> accumulations;  // the contexts of the parameters whose accumulation runs, innermost last
  std::vector<std::vector<c10::IValue>> math_bit_calls;  // the arguments of the frames that materialize some, innermost last
  std::vector<std::pair<bool, c10::IValue>> collective_calls;  // of the open c10d ops: waited at once, the list it receives into
  // The tensors live detaches inside open recorded ops were handed, each with that op's frame (its
  // index in frames), held until that op ends: what a saved-tensors hook detached of the outputs
  // autograd saves (saved_outputs).
  std::vector<std::pair<size_t, c10::IValue>> saved;
  // Of the open kModeCall frames, innermost last: the op, its sequence number and the last one made
  // before it, which the handler's call of that op records (below autograd, that call has none).
  std::vector<std::tuple<int32_t, int64_t, int64_t>> mode_calls;
  // The output of the last recorded detach of a plain tensor, until the next op (settle_detached).
  WeakImpl detached{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  int64_t detached_row = -1;  // its row (-1: none)
  bool in_hook = false;       // a hook of Python's runs (find_subclasses, owner_context): what it calls is not the step's
  int compiling = 0;          // Dynamo compiles on this thread (td_observer_compiling): what runs meanwhile is the compiler's
  // task="overflow_check": copies of what open calls write, as each started (watch::copy_written).
  std::vector<std::tuple<size_t, int16_t, int16_t, at::Tensor>> written_copies;
  // And what open calls take (watch::hold_inputs): an argument a call frees before it ends (a
  // temporary the engine hands a backward op) is read through it.
  std::vector<std::tuple<size_t, int16_t, int16_t, at::Tensor>> held_inputs;
  // What open calls that return nothing write (an in-place _foreach_ op's lists), by frame depth,
  // position and item: their outputs at their end, whatever the task (note_written).
  std::vector<std::tuple<size_t, int16_t, int16_t, WeakImpl>> written_args;
};
thread_local ThreadState state;

// ---- tensors _make_subclass makes ------------------------------------------------------------------
// nn.Parameter(t) (and every Tensor._make_subclass: FakeTensor's, a subclass's) detaches t, a plain
// tensor, with the dispatch modes stashed, so no dispatch mode sees that detach; the observer does.
// Its output is the new tensor, whose Python object _make_subclass makes right after, of the
// subclass; a plain tensor's detach called from Python returns a torch.Tensor. So a recorded detach's
// output is looked at again when the thread's next op starts (or capture stops), and its row marked
// kFoundHidden where its Python object is of another class than torch.Tensor (td_observer_tensor_type).
std::atomic<void*> tensor_type{nullptr};  // torch.Tensor, a PyTypeObject*

void settle_detached(ThreadState& thread) {
  void* plain = tensor_type.load(std::memory_order_relaxed);
  bool python_thread = plain != nullptr && Py_IsInitialized() && (PyGILState_Check() == 1 || PyGILState_GetThisThreadState() != nullptr);
  bool made_subclass = false;
  auto detached = thread.detached.lock();  // (freed since: no parameter either)
  auto row = thread.detached_row;
  thread.detached.reset();
  thread.detached_row = -1;
  // (an atomic load: most outputs have no Python object yet, an accumulated gradient's; no GIL taken then)
  if (python_thread && detached && detached->pyobj_slot()->load_pyobj() != nullptr) {
    auto gil = PyGILState_Ensure();
    void* object = detached->pyobj_slot()->load_pyobj();
    if (object != nullptr) {
      void* type = PyObject_Type(object);
      made_subclass = type != plain;
      Py_DecRef(type);
    }
    PyGILState_Release(gil);
  }
  if (made_subclass) {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    auto at = row - recorder.first_row;
    if (at >= 0 && at < static_cast<int64_t>(recorder.mark.size())) recorder.mark[static_cast<size_t>(at)] |= kFoundHidden;
  }
}

// ---- FSDP2 groups' ops: their owners -------------------------------------------------------------
// A collective or an fsdp op that an FSDP2 parameter group runs belongs to the group's module, in
// the pass it runs for (capture/collectives.py's collective_owner): only Python knows the group (a
// frame's self). So at such an op the observer calls a hook of capture/native_records.py's, with
// the GIL, which returns the row's module context: an owner's (<= -3: the walk names its module
// and phase), or kNotOwned; the copy-in's hook also notes the buffers its unshard hands out. The
// ops the hook runs are hidden (ThreadState::in_hook).
constexpr int64_t kNotOwned = -1;
std::atomic<void*> owner_hook{nullptr}, unshard_hook{nullptr};  // PyObject* callables, held by Python (td_observer_use_owners)

int64_t owner_context(int8_t grouped, bool& in_hook) {
  void* hook = (grouped == kUnshards ? unshard_hook : owner_hook).load(std::memory_order_relaxed);
  if (hook == nullptr || !Py_IsInitialized()) return kNotOwned;
  if (PyGILState_Check() != 1 && PyGILState_GetThisThreadState() == nullptr) return kNotOwned;  // (no Python frames)
  auto gil = PyGILState_Ensure();
  in_hook = true;
  void* result = call_hook(hook, nullptr);
  in_hook = false;
  int64_t context = kNotOwned;
  if (result != nullptr) {
    context = PyLong_AsLongLong(result);
    Py_DecRef(result);
  }
  if (PyErr_Occurred() != nullptr) {  // a result that is no int: the row keeps its context
    PyErr_Clear();
    context = kNotOwned;
  }
  PyGILState_Release(gil);
  return context;
}

// A conjugate or negative view handed to an op without a kernel for it: the math-bit fallback, below
// autograd and above the Python key, clones it and runs the op on the clone, so a dispatch mode sees
// that clone, then the op reading it (MathBitsFallback.h; an argument it writes is copied back after
// it from its clone: that copy is not recorded).
constexpr c10::DispatchKeySet kMathBits{c10::DispatchKeySet({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative})};
constexpr char kClone[] = "aten::clone";

// How many of a call's tensor arguments carry a math bit.
int8_t math_bit_arguments(c10::ArrayRef<const c10::IValue> inputs) {
  int8_t count = 0;
  for (const auto& value : inputs) {
    if (value.isTensor() && value.unsafeToTensorImpl()->key_set().has_any(kMathBits)) ++count;
  }
  return count;
}

// Whether an op called inside `parent` below autograd is the fallback's clone of one of its arguments
// (the frame's count first: a call of any other op inside a recorded one reads nothing more).
bool math_bit_clone(const Frame& parent, const at::RecordFunction& fn) {
  if (parent.materializes == 0 || parent.below || (parent.kind != kRecorded && parent.kind != kDeferred)) return false;
  auto inputs = fn.inputs();
  return !inputs.empty() && inputs[0].isTensor() && inputs[0].unsafeToTensorImpl()->key_set().has_any(kMathBits) &&
         std::strcmp(fn.name(), kClone) == 0;
}

// The context a row recorded now takes: the parameter's in its gradient's accumulation, else the
// module context Python set.
int64_t row_context(const ThreadState& thread) {
  return thread.accumulations.empty() ? module_context.load(std::memory_order_relaxed) : thread.accumulations.back();
}

// The context of the parameter whose AccumulateGrad node the engine evaluates now (`node`, its
// class `node_name`), or -1.
int64_t accumulation_context(torch::autograd::Node* node, const char* node_name) {
  auto length = std::strlen(node_name);
  constexpr auto suffix = sizeof(kAccumulateGrad) - 1;
  if (length < suffix || std::strcmp(node_name + length - suffix, kAccumulateGrad) != 0) return -1;
  auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node);
  if (accumulate == nullptr || !accumulate->variable.defined()) return -1;
  std::lock_guard<std::mutex> lock(parameters_mutex);
  auto found = parameter_context.find(accumulate->variable.unsafeGetTensorImpl());
  return found == parameter_context.end() ? -1 : found->second;
}

size_t pop_stash(ThreadState& thread) {  // the index of the stash let go
  stashes_in_use.fetch_sub(1, std::memory_order_relaxed);
  return --thread.stashed;
}

Stash& push_stash(ThreadState& thread) {
  if (thread.stashed == thread.stashes.size()) thread.stashes.emplace_back();
  auto& stash = thread.stashes[thread.stashed++];
  stashes_in_use.fetch_add(1, std::memory_order_relaxed);
  stash.slots.clear();
  return stash;
}

std::string overload_name(const c10::OperatorName& name) {
  std::string out = name.name;
  auto colon = out.find("::");
  if (colon != std::string::npos) out.replace(colon, 2, ".");
  out += ".";
  out += name.overload_name.empty() ? "default" : name.overload_name;
  return out;
}

// What td_observer_checkpoint last set (the frame ops) moves this, which drops the threads' caches.
std::atomic<uint64_t> ops_epoch{0};

OpInfo recorded_op_info(const at::RecordFunction& fn);

// An operator's name() points into its FunctionSchema, which lives as long as the operator is
// registered: a key per overload. A RecordFunction named by a string has its own copy of the name,
// so its pointer never equals a live schema's; it is not cached. Each thread keeps the ops it met
// (no lock, no division a call), taken from Recorder::ops on the first call.
OpInfo op_info(const at::RecordFunction& fn) {
  thread_local AddressMap<OpInfo> thread_known;
  thread_local uint64_t thread_known_epoch = 0;
  auto& known = thread_ref(thread_known);
  auto& known_epoch = thread_ref(thread_known_epoch);
  auto epoch = ops_epoch.load(std::memory_order_acquire);
  if (known_epoch != epoch) {
    known.clear();
    known_epoch = epoch;
  }
  auto key = address(fn.name());
  if (const auto* found = known.find(key); found != nullptr) return found->second;
  auto info = recorded_op_info(fn);
  if (info.id >= 0) known[key] = info;
  return info;
}

OpInfo recorded_op_info(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  auto found = recorder.ops.find(fn.name());
  if (found != recorder.ops.end()) return found->second;
  auto name = fn.operator_name();
  if (!name.has_value() || name->name.rfind("torchdebug::observer_", 0) == 0) return OpInfo{-1, kNotOp};  // (its own ops)
  OpInfo info{static_cast<int32_t>(recorder.names.size()), kind_of(*name)};
  if (auto op = c10::Dispatcher::singleton().findOp(*name); op.has_value()) {
    for (auto key : c10::autocast_dispatch_keyset) {
      if (op->hasKernelForDispatchKey(key)) info.autocast = info.autocast.add(key);
    }
  }
  recorder.names.push_back(overload_name(*name));
  info.frame_op = std::find(frame_ops.begin(), frame_ops.end(), recorder.names.back()) != frame_ops.end();
  auto handle = c10::Dispatcher::singleton().findSchema(*name);
  recorder.args.push_back(handle.has_value() ? op_args(handle->schema()) : OpArgs{});
  info.args = &recorder.args.back();
  recorder.written.emplace_back();
  auto& written = recorder.written.back();
  if (handle.has_value()) {
    const auto& arguments = handle->schema().arguments();
    for (size_t position = 0; position < arguments.size(); ++position) {
      const auto* alias = arguments[position].alias_info();
      if (alias != nullptr && alias->isWrite()) written.push_back(static_cast<int16_t>(position));
    }
  }
  if (undeclared_writes(*name)) {
    written = {3, 4};
    info.written_if = 5;
  }
  info.collective = name->name.rfind("c10d::", 0) == 0;
  if (name->name == "_c10d_functional::wait_tensor") {
    info.functional = kFunctionalWaited;
  } else if (name->name.rfind("_c10d_functional::", 0) == 0 && name->name != "_c10d_functional::_wrap_tensor_autograd") {
    info.functional = kFunctionalWrites;
  }
  info.receives = name->name == "c10d::recv_" || name->name == "c10d::recv_any_source_";
  info.writes_first = info.collective && name->name != "c10d::send" && name->name != "c10d::barrier" &&
                      name->name != "c10d::monitored_barrier_" && name->name != "c10d::check_for_nan";
  if (info.collective && handle.has_value()) {
    const auto& arguments = handle->schema().arguments();
    for (size_t position = 0; position < arguments.size(); ++position) {
      if (arguments[position].name() == "async_op") info.async_arg = static_cast<int16_t>(position);
    }
  }
  if (name->name.rfind("fsdp::", 0) == 0 || info.collective || info.functional == kFunctionalWrites) {
    info.grouped = name->name == "fsdp::all_gather_copy_in" ? kUnshards : kGrouped;
  }
  info.detach = name->name == "aten::detach" && name->overload_name.empty();
  info.mutable_op = !written.empty();
  info.written = &written;
  recorder.ops.emplace(fn.name(), info);
  return info;
}

// Whether a row takes its Python frames: a forward row when stacks are wanted, or when it is one of
// the frame ops (checkpoint's own detach and empty tell themselves by the functions on the stack); a
// backward row that may be a recomputation's (capture/native_records.py tells by its frames, as
// _torch/checkpoint.RecomputeDetector does): grad mode on, a frame op, or an op of the node such a
// row ran in last (a no_grad block inside a recomputed region).
bool frames_wanted(ThreadState& thread, const Row& row, bool frame_op) {
  if (!row.backward) return frame_op || want_stacks.load(std::memory_order_relaxed);
  if ((row.mark & kGradOn) || frame_op) {
    thread.frames_node = row.seq;
    return true;
  }
  return row.seq == thread.frames_node;
}

// Dispatch modes. A capture mode entered at start sits above the modes active then (a user's, outer
// to the capture): it sees each op and the outputs their handlers return, as the observer does. It
// sits below a mode entered later (selective checkpointing's, a user's inside the step), whose
// handler's own calls (with that mode popped) it sees: the observer records those calls, not the
// ones made under the mode (kModeCall), and hides every op under torch's infra modes (FakeTensorMode,
// proxy, functional: compile internals, which capture ignores). The op calls inside a torch.func
// transform are hidden too (in_transform), and counted: Python warns of them.
std::atomic<int64_t> hidden_in_transforms{0};
int64_t outer_modes = 0;  // the user modes active when the observer started

int64_t infra_modes() {
  int64_t modes = 0;
  for (auto key : {c10::impl::TorchDispatchModeKey::FAKE, c10::impl::TorchDispatchModeKey::PROXY,
                   c10::impl::TorchDispatchModeKey::FUNCTIONAL}) {
    if (c10::impl::TorchDispatchModeTLS::get_mode(key).has_value()) ++modes;
  }
  return modes;
}

int64_t user_modes() { return c10::impl::TorchDispatchModeTLS::stack_len() - infra_modes(); }

// Whether the op runs inside a torch.func transform (vmap, grad, jacrev: functorch's dynamic layer
// includes its front key meanwhile). A capture mode sees the ops the transform's batching rules and
// decompositions run on the plain tensors beneath it, which the observer cannot tell from the
// kernels' own calls: such ops are hidden and counted with those other modes hide (Python warns).
bool in_transform() {
  return c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

Frame* enclosing_op(ThreadState& thread) {
  for (auto frame = thread.frames.rbegin(); frame != thread.frames.rend(); ++frame) {
    if (frame->kind != kTransparent && frame->kind != kBackward && frame->kind != kModeCall) return &*frame;
  }
  return nullptr;
}

// The stashed op is recorded now: a pending one reached below autograd, a deferred one goes there.
void settle(ThreadState& thread, Frame& frame, bool below) {
  auto& stash = thread.stashes[pop_stash(thread)];
  if (stash.row.stack < 0) stash.row.stack = python_frames(frames_wanted(thread, stash.row, frame.frame_op));
  std::lock_guard<std::mutex> lock(recorder.mutex);
  frame.row = recorder.add_row(std::move(stash.row));
  recorder.slots.append(stash.slots, frame.row);
  frame.kind = kRecorded;
  frame.below = below;
}

// Whether a live op called inside a recorded op's autograd kernel reads one of that op's inputs:
// called before the redispatch (an in-place op's self.clone(), a saved-tensors hook packing an
// input), which a dispatch mode sees before the op; one reading something else (a pack hook's detach
// of a saved output) runs after it, which the mode sees after the op too.
bool reads_inputs_of(const Frame& parent, c10::ArrayRef<const c10::IValue> values) {
  const c10::IValue* first = nullptr;
  for (const auto& value : values) {
    if (is_tensor(value)) {
      first = &value;
      break;
    }
  }
  if (first == nullptr) return true;
  std::lock_guard<std::mutex> lock(recorder.mutex);
  auto address = key_of(reinterpret_cast<int64_t>(first->unsafeToTensorImpl()));
  const auto& slots = recorder.slots;
  for (auto slot = slots.row.size(); slot-- > 0 && slots.row[slot] == parent.row;) {
    if (slots.io[slot] == 0 && slots.value[slot] == address) return true;
  }
  return false;
}

// Move a recorded op's row (the last one, with its inputs) into a stash; false when another thread
// recorded rows since (it then stays where it is).
bool defer(ThreadState& thread, Frame& frame) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (frame.row != recorder.first_row + static_cast<int64_t>(recorder.op.size()) - 1) return false;
  auto& stash = push_stash(thread);
  stash.row = recorder.pop_row();
  recorder.slots.move_tail(frame.row, stash.slots);
  frame.kind = kDeferred;
  return true;
}

// Note the tensors a call of `info` writes, with their versions now (ThreadState::writes; -1 for an
// inference tensor, which keeps none): where they start, or -1 for none.
int32_t note_writes(ThreadState& thread, const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs) {
  if (!info.mutable_op) return -1;
  if (info.written_if >= 0) {
    auto at = static_cast<size_t>(info.written_if);
    if (at >= inputs.size() || !inputs[at].isBool() || !inputs[at].toBool()) return -1;
  }
  auto from = static_cast<int32_t>(thread.writes.size());
  std::lock_guard<std::mutex> lock(reads_mutex);
  auto note = [&](const c10::IValue& value) {
    if (!is_tensor(value)) return;
    auto* impl = value.unsafeToTensorImpl();
    thread.writes.emplace_back(impl, impl->is_inference() ? int64_t{-1} : static_cast<int64_t>(impl->version_counter().current_version()));
    if (impl->has_storage()) ++storage_writes[address(impl->unsafe_storage().unsafeGetStorageImpl())];
  };
  for (auto position : *info.written) {
    if (static_cast<size_t>(position) >= inputs.size()) continue;
    const auto& value = inputs[static_cast<size_t>(position)];
    if (value.isList()) {
      for (const auto& item : value.toListRef()) note(item);
    } else {
      note(value);
    }
  }
  return from;
}

// The kept_version of a kept tensor replaced by its copy (snapshot_kept). A copy holds the values
// from before the write, and its storage is not the tensor's: the writes counted into the tensor's
// storage do not tell them apart from a later read's at the same version (a collective's moves
// none), and the copy's storage, at an address a freed storage had, may carry that one's count. So
// a copy is never staged as holding the same values as another slot (staged_facts).
constexpr int64_t kCopied = -2;

// Copy each kept tensor (its sums left to Python's flush: an int64 counter, a complex or float16
// tensor) on the memory a call is about to write, which by the flush would hold what the call and
// later ones wrote, where a dispatch mode reads it at its op: the call's own inputs (an int64
// counter's add_), and what earlier ops returned or read (zeros a backward fills through a slice).
// The copy is taken with no observer and below autograd (no row, no graph), and takes its slot's
// version, so the drain hands it over as read (an inference tensor's copy, at no version, is handed
// over as any inference tensor). Where Python stages kept tensors (staging) and `copy` is false, the
// op instead starts once they are staged (stage_due; on_enter copies what that left). Called with the
// slots' lock held. Only the entries a staging may still hold are looked at: those it left
// (stage_retry) and those kept since it last looked (from stage_scan on); before stage_scan every
// other entry was handed over (undefined) or is of a kind never copied here. A look at every entry of
// the step at each write took time quadratic in the step: 1.4 billion looks in 60,000 calls of the
// tiny GPT at 48 layers with every tensor staged (2026-12-04).
template <typename Written>
void snapshot_kept(Slots& slots, const Written& written, bool copy_now) {
  auto look = [&](size_t entry) {
    auto& tensor = slots.kept[entry];
    auto at = static_cast<size_t>(slots.kept_slot[entry]);
    if (!tensor.defined() || slots.flag[at] != kPlain || !tensor.has_storage() || !memory_held(tensor)) return;
    if (!written(tensor.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl())) return;
    if (!copy_now && staging()) {
      stage_due = true;
      return;
    }
    at::Tensor copy;
    {
      at::DisableRecordFunctionGuard no_observer;
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      copy = tensor.clone();
    }
    if (slots.version[at] >= 0) copy.unsafeGetTensorImpl()->set_version_counter(c10::VariableVersion(static_cast<uint32_t>(slots.version[at])));
    slots.kept_original[entry] = WeakImpl(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());  // the copy holds what the slot read, whatever the tensor becomes
    slots.kept_version[entry] = kCopied;
    tensor = std::move(copy);
  };
  for (auto entry : slots.stage_retry) look(entry);
  for (size_t entry = slots.stage_scan; entry < slots.kept.size(); ++entry) look(entry);
  write_looked.fetch_add(static_cast<int64_t>(slots.stage_retry.size() + slots.kept.size() - slots.stage_scan), std::memory_order_relaxed);
}

void snapshot_written(Slots& slots, const ThreadState& thread, int32_t writes_from, bool copy_now = false) {
  if (writes_from < 0 || slots.kept.empty()) return;
  auto written = thread.writes.begin() + writes_from;
  snapshot_kept(
      slots,
      [&](const c10::StorageImpl* storage) {
        return std::any_of(written, thread.writes.end(), [storage](const auto& noted) {
          return noted.first->has_storage() && noted.first->unsafe_storage().unsafeGetStorageImpl() == storage;
        });
      },
      copy_now);
}

// The same before a c10d collective that writes its first argument (OpInfo::writes_first): its schema
// marks no write, and its work writes once it completes, by when a kept tensor on that memory (a
// float16 or complex summand, whose statistics wait for the flush) would hold other ranks' values.
void snapshot_collective(Slots& slots, const c10::IValue& first) {
  if (slots.kept.empty()) return;
  std::vector<const c10::StorageImpl*> storages;
  std::function<void(const c10::IValue&)> note = [&](const c10::IValue& value) {
    if (value.isList()) {
      for (const auto& item : value.toListRef()) note(item);
    } else if (is_tensor(value) && value.unsafeToTensorImpl()->has_storage()) {
      storages.push_back(value.unsafeToTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
    }
  };
  note(first);
  snapshot_kept(
      slots, [&](const c10::StorageImpl* storage) { return std::find(storages.begin(), storages.end(), storage) != storages.end(); },
      true);
}

// The call that noted writes from `from` on returned: each written tensor whose version torch did not
// move (each tensor once) counts a write in the versions its later slots record, and what was read
// of it is read again.
void count_unmoved(ThreadState& thread, int32_t from) {
  thread_local std::vector<c10::TensorImpl*> still;  // kept between calls: no allocation per in-place op
  still.clear();
  for (auto at = static_cast<size_t>(from); at < thread.writes.size(); ++at) {
    auto [impl, before] = thread.writes[at];
    if (before >= 0 && static_cast<int64_t>(impl->version_counter().current_version()) == before) still.push_back(impl);
  }
  if (still.empty()) return;  // the common case: torch moved them all
  std::sort(still.begin(), still.end());
  still.erase(std::unique(still.begin(), still.end()), still.end());
  {
    std::lock_guard<std::mutex> lock(unmoved_mutex);
    for (auto* impl : still) {
      auto found = unmoved.find(impl);
      if (found == unmoved.end()) {
        unmoved.emplace(impl, Unmoved{WeakImpl::reclaim_copy(impl), 1});
      } else {
        ++found->second.writes;
      }
    }
    any_unmoved.store(true, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(reads_mutex);
  for (auto* impl : still) forget_read(impl);
}

// Scopes whose ops run as compiled code: Dynamo's run of a compiled frame ("Torch-Compiled Region:
// 0/0", a FUNCTION scope it opens whether or not a profiler runs), and the engine's evaluation of the
// node of AOT autograd's Function around a compiled graph, its backward. The dispatch mode tells the
// same ops (_torch/frames.py's in_compiled_code). Unchanged from torch 2.11 through 2.14.1.
constexpr char kCompiledRegion[] = "Torch-Compiled Region";
constexpr char kCompiledBackward[] = "autograd::engine::evaluate_function: CompiledFunctionBackward";
bool compiled_scope(const char* name) {
  if (name[0] == 'T') return std::strncmp(name, kCompiledRegion, sizeof(kCompiledRegion) - 1) == 0;
  return name[0] == 'a' && name[1] == 'u' && std::strcmp(name, kCompiledBackward) == 0;  // (no aten op's: "at...")
}

std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn, ThreadState& thread);

// Whether a record_function region (RecordScope::USER_SCOPE) named `name` is one in which an FSDP2
// parameter group reshards: it frees its all-gather buffers (their storage resized to 0 bytes, no
// op) under the unsharded parameters that ops read, and a kept tensor on them is staged first. So
// named in torch 2.11 to 2.14 (_fsdp_param_group.py's post_forward and post_backward); the other
// reshards (FSDPModule.reshard(), a lazy init) leave the kept tensors on them unread (memory_held).
bool reshards_next(const char* name) {
  constexpr char kForward[] = "FSDP::post_forward", kBackward[] = "FSDP::post_backward_reshard";
  return std::strncmp(name, kForward, sizeof(kForward) - 1) == 0 || std::strncmp(name, kBackward, sizeof(kBackward) - 1) == 0;
}

// Stage the kept tensors before the op that starts runs (stage_due): Python's hook takes them
// (observer_stage_kept), with the GIL and what it runs hidden (ThreadState::in_hook); then what it
// left on memory the op writes is copied, as where nothing stages them.
void stage_kept_now(ThreadState& thread) {
  stage_due = false;
  void* hook = stage_hook.load(std::memory_order_relaxed);
  if (hook != nullptr && Py_IsInitialized()) {
    auto gil = PyGILState_Ensure();
    bool in_hook = thread.in_hook;
    thread.in_hook = true;
    void* result = call_hook(hook, nullptr);
    if (result != nullptr) Py_DecRef(result);
    thread.in_hook = in_hook;
    PyGILState_Release(gil);
  }
  if (thread.frames.empty() || thread.frames.back().writes < 0) return;
  auto writes = thread.frames.back().writes;
  if (thread.frames.back().kind == kPending && thread.stashed > 0) {
    snapshot_written(thread.stashes[thread.stashed - 1].slots, thread, writes, true);
  }
  std::lock_guard<std::mutex> lock(recorder.mutex);
  snapshot_written(recorder.slots, thread, writes, true);
}

// ---- the arguments a call writes ----------------------------------------------------------------
// Call `visit(item, position, element)` for argument `value` at `position`: for each item of a
// list (element its index), or for the value itself (element -1).
template <typename Visit>
void visit_argument(const c10::IValue& value, size_t position, const Visit& visit) {
  if (value.isList()) {
    auto items = value.toListRef();
    for (size_t index = 0; index < items.size(); ++index) visit(items[index], static_cast<int16_t>(position), static_cast<int16_t>(index));
  } else {
    visit(value, static_cast<int16_t>(position), int16_t{-1});
  }
}

// `visit_argument` for each argument among `inputs` that a call of `info` writes.
template <typename Visit>
void visit_written(const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs, const Visit& visit) {
  for (auto position : *info.written) {
    if (static_cast<size_t>(position) < inputs.size()) visit_argument(inputs[static_cast<size_t>(position)], static_cast<size_t>(position), visit);
  }
}

// Whether a call of `info` writes arguments and returns nothing (an in-place _foreach_ op).
bool writes_unreturned(const OpInfo& info) { return info.mutable_op && info.args != nullptr && info.args->outputs.empty(); }

// As a call that writes its arguments and returns nothing starts (an in-place _foreach_ op, its frame
// at `depth`): note what it writes, which its records take for its outputs (as the dispatch mode's).
void note_written(std::vector<std::tuple<size_t, int16_t, int16_t, WeakImpl>>& noted, size_t depth, const OpInfo& info,
                  c10::ArrayRef<const c10::IValue> inputs) {
  visit_written(info, inputs, [&](const c10::IValue& value, int16_t position, int16_t element) {
    if (is_tensor(value)) noted.emplace_back(depth, position, element, WeakImpl::reclaim_copy(value.unsafeToTensorImpl()));
  });
}

// The entries of `from` of the frame at `depth` or deeper (ended), taken out.
template <typename Entries>
Entries take_frame(Entries& from, size_t depth) {
  Entries taken;
  if (from.empty() || std::get<0>(from.back()) < depth) return taken;
  auto first = from.size();
  while (first > 0 && std::get<0>(from[first - 1]) >= depth) --first;
  std::move(from.begin() + static_cast<std::ptrdiff_t>(first), from.end(), std::back_inserter(taken));
  from.erase(from.begin() + static_cast<std::ptrdiff_t>(first), from.end());
  return taken;
}

// ---- task="overflow_check": the op calls that make a NaN or an Inf, judged as each ends ----------
// capture/native_overflow.py hands over nonfinite.py's rule as tables (td_observer_watch_overflow):
// each dtype's largest finite magnitude, the numbers that count as a given limit, and OriginTracker's
// verdict for every combination of flags and state, so the rule stays written once. Each recorded
// call is judged as it ends, from the statistics its slots took (the callback's; a dtype the
// callback does not sum, float16 or complex, is looked at with torch ops) and its numbers; a call
// found to make a NaN/Inf (an origin) or to pass on one no call made (an entry) keeps copies of its
// tensors as they were at the call (what it writes copied as it starts), which the drain hands over
// with its row (td_observer_overflow_found). Python's facts of an op (which of its slots hold no
// value of the run) are asked once per op, of the first call whose outputs hold a NaN or an Inf.
namespace watch {
constexpr int kNan = 1, kInf = 2, kLimit = 4;  // nonfinite.py's NAN, INF, LIMIT
constexpr int kOrigin = 2, kEntry = 3;         // verdict kinds (native_overflow.py's codes)
constexpr int64_t kNeverJudged = 1;            // facts: an allocation, a collective, a wait
constexpr int64_t kAllocates = int64_t{1} << 30;  // facts: an allocation (its outputs hold no value)
constexpr int kUnreadInputs = 1, kUnreadOutputs = 32;  // facts: bit kUnreadInputs + position, kUnreadOutputs + index

std::atomic<bool> on{false};
// Recorder::mutex held for all below.
std::array<double, 128> limits{};      // by ScalarType: finfo(dtype).max, +inf where none, NaN: not judged
std::vector<double> given;             // magnitudes of numbers that count as a given limit
std::array<uint8_t, 256> verdicts{};   // by in | out << 3 | made << 6 | held << 7: kind | made << 2 | held << 3
std::atomic<void*> facts_hook{nullptr};  // PyObject*: (op id) -> int, held by Python
std::vector<int64_t> facts;            // by op id; -1: not asked yet
// Storages (by slot key) an allocation handed out and nothing wrote since, with the allocation's
// output and its version then (unwritten.py's UnwrittenStorages).
std::unordered_map<int64_t, std::pair<WeakImpl, int64_t>> unwritten;
// The plain tensors of subclass arguments the callback could not read as their call started (a
// collective still wrote them: an AsyncCollectiveTensor's, waited for inside the call), by
// (row, argument, item): read at the call's end.
std::map<std::tuple<int64_t, int16_t, int16_t>, WeakImpl> plains;
bool made = false, held = false;       // OriginTracker's state in this step
int64_t budget = -1;                   // calls whose tensors are still kept (-1: no end)
std::vector<int64_t> rows;             // the calls found (absolute rows) and their kinds
std::vector<int8_t> kinds;
std::vector<int64_t> kept_slots;       // the slot (an index into recorder.slots) of each copy kept
std::vector<at::Tensor> kept;
std::vector<int64_t> handed_rows, handed_slots;  // what the last drain handed over (td_observer_overflow_found)
std::vector<int8_t> handed_kinds;
std::vector<at::Tensor> handed;

using Copies = std::vector<std::tuple<size_t, int16_t, int16_t, at::Tensor>>;  // (frame depth, argument, element, copy)

// Mark the storage keyed `key` as holding no value, by `impl` (unwritten.py's UnwrittenStorages.add):
// a mark that holds (its tensor alive, at its version) stays, a stale one is replaced.
void mark_unwritten(int64_t key, c10::TensorImpl* impl) {
  auto found = unwritten.find(key);
  if (found != unwritten.end()) {
    auto holder = found->second.first.lock();
    if (holder && Slots::current_version(holder.get()) == found->second.second) return;
  }
  unwritten.insert_or_assign(key, std::make_pair(WeakImpl::reclaim_copy(impl), Slots::current_version(impl)));
}

bool judged_dtype(int8_t dtype) { return dtype >= 0 && static_cast<size_t>(dtype) < limits.size() && !std::isnan(limits[dtype]); }

std::atomic<bool> copies_fail{false};  // td_observer_overflow_copies_fail (tests): every copy fails as memory would

// A copy of `tensor` made unseen (no row, no graph), as snapshot_kept makes one; undefined where
// making it failed (memory): its slot then saves no tensor, and the op runs on.
at::Tensor copy_of(const at::Tensor& tensor) {
  at::DisableRecordFunctionGuard no_observer;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
  try {
    if (copies_fail.load(std::memory_order_relaxed)) throw std::bad_alloc();
    return tensor.clone();
  } catch (const std::exception&) {
    return at::Tensor();
  }
}

// The tensor whose values a written argument holds: a plain CPU tensor of a judged dtype, or a
// subclass instance's plain tensor (as find_subclasses found it for this op), else none.
c10::TensorImpl* copyable(const c10::IValue& value) {
  if (!is_tensor(value)) return nullptr;
  auto* impl = value.unsafeToTensorImpl();
  if (impl->key_set().has(c10::DispatchKey::Python)) {
    const auto* found = plain_of.find(address(impl));
    impl = found != nullptr ? reinterpret_cast<c10::TensorImpl*>(found->second) : nullptr;
    if (impl == nullptr) return nullptr;
  }
  bool judged = impl->layout() == c10::kStrided && impl->is_cpu() && impl->numel() > 0 &&
                judged_dtype(static_cast<int8_t>(impl->dtype().toScalarType()));
  return judged ? impl : nullptr;
}

// As a call that writes its arguments starts (its frame at `depth`; its inputs' subclass instances
// found): copy what it writes, its values before the call, which a call found keeps as its inputs
// (ThreadState::written_copies).
void copy_written(Copies& copies, size_t depth, const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs) {
  visit_written(info, inputs, [&](const c10::IValue& value, int16_t position, int16_t element) {
    if (auto* impl = copyable(value); impl != nullptr) {
      // (a failed copy stays, undefined: the argument then saves no tensor, not its values after the call)
      copies.emplace_back(depth, position, element, copy_of(at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl))));
    }
  });
}

// As a recorded call starts (its frame at `depth`): hold its plain tensor arguments (aliases: their
// storage, not the tensors, whose use counts torch reads), for the end of the call.
void hold_inputs(Copies& held, size_t depth, c10::ArrayRef<const c10::IValue> inputs) {
  for (size_t position = 0; position < inputs.size(); ++position) {
    visit_argument(inputs[position], position, [&](const c10::IValue& value, int16_t at, int16_t element) {
      if (!is_tensor(value)) return;
      auto* impl = value.unsafeToTensorImpl();
      if (impl->key_set().has(c10::DispatchKey::Python) || impl->layout() != c10::kStrided || !impl->is_cpu() || impl->numel() == 0) return;
      if (!judged_dtype(static_cast<int8_t>(impl->dtype().toScalarType()))) return;
      held.emplace_back(depth, at, element, Slots::held(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl)));
    });
  }
}

// The flags of a number given as JSON text: nonfinite.value_flags (a bool, a list, a string: none).
int number_flags(const std::string& text) {
  if (text.empty() || !(text[0] == '-' || text[0] == 'N' || text[0] == 'I' || (text[0] >= '0' && text[0] <= '9'))) return 0;
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  if (end == nullptr || *end != '\0') return 0;
  if (std::isnan(number)) return kNan;
  if (std::isinf(number)) return kInf;
  return std::find(given.begin(), given.end(), std::fabs(number)) != given.end() ? kLimit : 0;
}

// The tensor of a recorder slot, if alive (a sweep let go of the slot's reference into Recorder::seen).
at::Tensor slot_tensor(size_t slot) {
  auto& slots = recorder.slots;
  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> strong;
  if (!refers_to_nothing(slots.alive[slot])) {
    strong = slots.alive[slot].lock();
  } else if (const auto* found = recorder.seen.find(slots.value[slot]); found != nullptr) {
    strong = found->second.weak.lock();
  }
  return strong ? at::Tensor(std::move(strong)) : at::Tensor();
}

// The flags of a tensor slot (nonfinite.tensor_flags of its statistics); with `limits_too` false,
// NaN and Inf alone (an output's); `before`: a written argument's copy, its values at the call;
// `held`: an argument's alias, read where the argument was freed before the call ended.
int tensor_flags(size_t slot, bool limits_too, const at::Tensor& before = at::Tensor(), const at::Tensor& held = at::Tensor()) {
  auto& slots = recorder.slots;
  auto dtype = slots.dtype[slot];
  if (slots.flag[slot] != kPlain && slots.flag[slot] != kSubclass) return 0;
  if (!judged_dtype(dtype)) return 0;
  double limit = limits[dtype];
  if (slots.has_stats[slot]) {
    const double* sums = slots.stats.data() + slot * kStatsWidth;  // min, max, sum, squares, nan, posinf, neginf, zeros
    int flags = (sums[4] > 0 ? kNan : 0) | (sums[5] + sums[6] > 0 ? kInf : 0);
    if (limits_too && (sums[1] >= limit || sums[0] <= -limit)) flags |= kLimit;
    return flags;
  }
  at::Tensor tensor = before;
  if (!tensor.defined() && slots.flag[slot] == kSubclass) {  // its plain tensor, if it was in flight as its call started
    auto found = plains.find({slots.row[slot], slots.arg[slot], slots.element[slot]});
    auto plain = found != plains.end() ? found->second.lock() : c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>();
    if (!plain) return 0;
    tensor = at::Tensor(std::move(plain));
  } else if (!tensor.defined()) {
    if (slots.flag[slot] != kPlain || slots.device_type[slot] != static_cast<int8_t>(c10::DeviceType::CPU)) return 0;
    tensor = slot_tensor(slot);  // a dtype the callback does not sum: torch's ops look
    if (!tensor.defined()) tensor = held;
  }
  if (!tensor.defined() || !tensor.is_cpu() || tensor.numel() == 0 || tensor.layout() != c10::kStrided) return 0;
  try {
    at::DisableRecordFunctionGuard no_observer;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
    if (tensor.is_complex()) {
      tensor = tensor.abs();  // (statistics' values: stats/_torch_ops.py's as_real)
    } else if (c10::isFloat8Type(tensor.scalar_type())) {
      tensor = tensor.to(at::kFloat);
    }
    if (!limits_too && tensor.isfinite().all().item<bool>()) return 0;
    int flags = (tensor.isnan().any().item<bool>() ? kNan : 0) | (tensor.isinf().any().item<bool>() ? kInf : 0);
    if (limits_too && std::isfinite(limit) && (tensor.abs() >= limit).any().item<bool>()) flags |= kLimit;
    return flags;
  } catch (const std::exception&) {  // a dtype torch's ops do not take: not judged
    return 0;
  }
}

// Python's facts of op `id` (asked once: with the GIL, what the hook runs hidden), 0 without a hook.
int64_t op_facts(ThreadState& thread, int32_t id) {
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    if (static_cast<size_t>(id) < facts.size() && facts[id] >= 0) return facts[id];
  }
  int64_t found = 0;
  void* hook = facts_hook.load(std::memory_order_relaxed);
  if (hook != nullptr && Py_IsInitialized()) {
    auto gil = PyGILState_Ensure();
    bool in_hook = thread.in_hook;
    thread.in_hook = true;
    void* argument = PyLong_FromLongLong(id);
    void* result = argument != nullptr ? call_hook(hook, argument) : nullptr;
    if (argument != nullptr) Py_DecRef(argument);
    if (result != nullptr) {
      found = PyLong_AsLongLong(result);
      if (found < 0) {
        PyErr_Clear();
        found = 0;
      }
      Py_DecRef(result);
    } else {
      PyErr_Clear();
    }
    thread.in_hook = in_hook;
    PyGILState_Release(gil);
  }
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (facts.size() <= static_cast<size_t>(id)) facts.resize(static_cast<size_t>(id) + 1, -1);
  facts[id] = found;
  return found;
}

// The plain tensor holding the elements of subclass instance `impl`, as Python's hook names it
// (find_subclass), or null: with the GIL, what the hook runs hidden.
c10::TensorImpl* plain_tensor_for(ThreadState& thread, c10::TensorImpl* impl) {
  void* hook = subclass_hook.load(std::memory_order_relaxed);
  if (hook == nullptr || !Py_IsInitialized()) return nullptr;
  auto gil = PyGILState_Ensure();
  bool in_hook = thread.in_hook;
  thread.in_hook = true;
  plain_of.clear();
  find_subclass(impl, hook, true);
  const auto* found = plain_of.find(address(impl));
  auto plain = found != nullptr ? found->second : 0;
  plain_of.clear();
  thread.in_hook = in_hook;
  PyGILState_Release(gil);
  return reinterpret_cast<c10::TensorImpl*>(plain);
}

// The first slot of the row recorded at `row` among the recorder's slots (those of later rows follow it).
size_t first_slot_of(int64_t row) {
  const auto& slots = recorder.slots;
  auto from = slots.row.size();
  while (from > 0 && slots.row[from - 1] >= row) --from;
  return from;
}

// The entry of argument `arg` (item `element` of a list) among a call's copies (undefined where
// making it failed) or held arguments, or null for none.
const at::Tensor* entry_of(const Copies& copies, int16_t arg, int16_t element) {
  for (const auto& copy : copies) {
    if (std::get<1>(copy) == arg && std::get<2>(copy) == element) return &std::get<3>(copy);
  }
  return nullptr;
}

// Whether slot `slot` (plain) lies on memory nothing has written since an allocation handed it out
// (unwritten.py's UnwrittenStorages.why): its marker alive and at the version it had then.
bool unwritten_slot(size_t slot) {
  if (unwritten.empty() || recorder.slots.flag[slot] != kPlain) return false;
  auto found = unwritten.find(recorder.slots.storage[slot]);
  if (found == unwritten.end()) return false;
  auto holder = found->second.first.lock();
  if (holder && Slots::current_version(holder.get()) == found->second.second) return true;
  unwritten.erase(found);
  return false;
}

// As a recorded call starts (its input slots from `first` on): which of them lie on unwritten memory
// (Frame::unwritten_inputs, by input slot, the first 64).
uint64_t unwritten_inputs(size_t first) {
  uint64_t mask = 0;
  for (auto slot = first; slot < recorder.slots.row.size() && slot - first < 64; ++slot) {
    if (unwritten_slot(slot)) mask |= uint64_t{1} << (slot - first);
  }
  return mask;
}

// As a recorded call starts (its input slots from `first` on, its subclass instances found): note
// the plain tensors of those the callback left unread (plains).
void note_plains(size_t first) {
  auto& slots = recorder.slots;
  for (auto slot = first; slot < slots.row.size(); ++slot) {
    if (slots.flag[slot] != kSubclass || slots.has_stats[slot]) continue;
    auto instance = slot_tensor(slot);
    const auto* found = instance.defined() ? plain_of.find(address(instance.unsafeGetTensorImpl())) : nullptr;
    if (found == nullptr || found->second == 0) continue;
    plains.insert_or_assign({slots.row[slot], slots.arg[slot], slots.element[slot]},
                            WeakImpl::reclaim_copy(reinterpret_cast<c10::TensorImpl*>(found->second)));
  }
}

// A recorded call ended (its frame `frame`, popped; `copies`: what it wrote, as it started;
// `arguments`: its arguments held, hold_inputs): follow the memory it handed out or wrote, judge it, and keep copies
// of its tensors if it is an origin or an entry.
void judge(ThreadState& thread, const Frame& frame, const Copies& copies, const Copies& arguments) {
  int32_t op = -1;
  int64_t known = -1;
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    auto at = frame.row - recorder.first_row;
    if (at < 0 || at >= static_cast<int64_t>(recorder.op.size())) return;
    op = recorder.op[static_cast<size_t>(at)];
    if (static_cast<size_t>(op) < facts.size()) known = facts[static_cast<size_t>(op)];
  }
  auto op_facts_now = known >= 0 ? known : op_facts(thread, op);  // (Python, once an op)
  std::unique_lock<std::mutex> lock(recorder.mutex);
  auto& slots = recorder.slots;
  auto from = first_slot_of(frame.row);
  if (op_facts_now & kAllocates) {  // its outputs hold no value until an op writes them (markable)
    for (auto slot = from; slot < slots.row.size(); ++slot) {
      if (slots.row[slot] != frame.row || slots.io[slot] != 1 || slots.flag[slot] != kPlain || slots.version[slot] < 0) continue;
      auto tensor = slot_tensor(slot);
      if (tensor.defined()) mark_unwritten(slots.storage[slot], tensor.unsafeGetTensorImpl());
    }
    return;
  }
  if (op_facts_now & kNeverJudged) return;
  auto unread = [&](size_t slot) {
    int bit = slots.io[slot] == 0 ? kUnreadInputs + slots.arg[slot] : kUnreadOutputs + slots.arg[slot];
    return slots.arg[slot] >= 0 && slots.arg[slot] < 24 && ((op_facts_now >> bit) & 1);
  };
  if (!unwritten.empty()) {  // what it wrote holds values from now on: its undeclared writes, and with writes its outputs
    for (auto slot = from; slot < slots.row.size(); ++slot) {
      if (slots.row[slot] == frame.row && slots.flag[slot] == kPlain && ((slots.io[slot] == 0 && unread(slot)) || (slots.io[slot] == 1 && frame.writes >= 0))) {
        unwritten.erase(slots.storage[slot]);
      }
    }
  }
  int in = 0, out = 0;
  size_t input = 0;
  for (auto slot = from; slot < slots.row.size(); ++slot) {
    if (slots.row[slot] != frame.row) continue;
    bool on_unwritten = slots.io[slot] == 0 ? input < 64 && ((frame.unwritten_inputs >> input) & 1) : unwritten_slot(slot);
    if (slots.io[slot] == 0) ++input;
    if (unread(slot) || on_unwritten) continue;
    if (slots.io[slot] == 1) {
      out |= tensor_flags(slot, false);
    } else {
      const auto* copied = slots.flag[slot] == kValue ? nullptr : entry_of(copies, slots.arg[slot], slots.element[slot]);
      const auto* alias = slots.flag[slot] == kValue ? nullptr : entry_of(arguments, slots.arg[slot], slots.element[slot]);
      in |= slots.flag[slot] == kValue ? number_flags(slots.text[slot])
                                       : tensor_flags(slot, true, copied != nullptr ? *copied : at::Tensor(), alias != nullptr ? *alias : at::Tensor());
    }
  }
  if (!(out & (kNan | kInf))) return;  // (nearly every call: finite, or nothing judged)
  auto verdict = verdicts[static_cast<size_t>(in | out << 3 | (made ? 1 : 0) << 6 | (held ? 1 : 0) << 7)];
  made = (verdict >> 2) & 1;
  held = (verdict >> 3) & 1;
  int kind = verdict & 3;
  if ((kind != kOrigin && kind != kEntry) || budget == 0) return;
  if (budget > 0) --budget;
  rows.push_back(frame.row);
  kinds.push_back(static_cast<int8_t>(kind));
  std::vector<std::pair<size_t, at::Tensor>> instances;  // subclass slots: their plain tensors, asked of Python below
  for (auto slot = from; slot < slots.row.size(); ++slot) {
    if (slots.row[slot] != frame.row || unread(slot) || (slots.flag[slot] != kPlain && slots.flag[slot] != kSubclass)) continue;
    const auto* copied = slots.io[slot] == 0 ? entry_of(copies, slots.arg[slot], slots.element[slot]) : nullptr;
    at::Tensor copy;
    if (copied != nullptr) {
      copy = *copied;
    } else {
      auto tensor = slot_tensor(slot);
      const auto* alias = slots.io[slot] == 0 && !tensor.defined() ? entry_of(arguments, slots.arg[slot], slots.element[slot]) : nullptr;
      if (alias != nullptr) tensor = *alias;  // (freed before the call ended)
      if (!tensor.defined() || tensor.numel() == 0) continue;  // (an empty one is made at the drain)
      if (slots.flag[slot] == kSubclass) {
        instances.emplace_back(slot, std::move(tensor));
        continue;
      }
      copy = copy_of(tensor);
    }
    if (!copy.defined()) continue;  // (making it failed: no tensor saved)
    kept_slots.push_back(static_cast<int64_t>(slot));
    kept.push_back(std::move(copy));
  }
  lock.unlock();
  for (auto& [slot, instance] : instances) {  // (the instance holds its plain tensor alive meanwhile)
    auto* plain = plain_tensor_for(thread, instance.unsafeGetTensorImpl());
    if (plain == nullptr || plain->numel() == 0 || !plain->is_cpu() || plain->layout() != c10::kStrided) continue;
    auto copy = copy_of(at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(plain)));
    if (!copy.defined()) continue;
    lock.lock();
    kept_slots.push_back(static_cast<int64_t>(slot));
    kept.push_back(std::move(copy));
    lock.unlock();
  }
}

// At a drain of `slots` slot rows and the op rows before `end_row`: hand over what was found there.
void hand_over(size_t slots, int64_t end_row) {
  plains.clear();  // (of calls ended: their rows drained now)
  for (auto entry = unwritten.begin(); entry != unwritten.end();) {  // memory freed unwritten: bounded by what is alive
    entry = entry->second.first.expired() ? unwritten.erase(entry) : std::next(entry);
  }
  handed_rows.clear();
  handed_kinds.clear();
  handed_slots.clear();
  handed.clear();
  size_t left = 0;  // (rows still open stay, in their order)
  for (size_t at = 0; at < rows.size(); ++at) {
    if (rows[at] < end_row) {
      handed_rows.push_back(rows[at]);
      handed_kinds.push_back(kinds[at]);
    } else {
      rows[left] = rows[at];
      kinds[left++] = kinds[at];
    }
  }
  rows.resize(left);
  kinds.resize(left);
  left = 0;
  for (size_t at = 0; at < kept_slots.size(); ++at) {
    if (static_cast<size_t>(kept_slots[at]) < slots) {
      handed_slots.push_back(kept_slots[at]);
      handed.push_back(std::move(kept[at]));
    } else {
      kept_slots[left] = kept_slots[at] - static_cast<int64_t>(slots);
      kept[left++] = std::move(kept[at]);
    }
  }
  kept_slots.resize(left);
  kept.resize(left);
}
}  // namespace watch

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (level.load(std::memory_order_relaxed) != kRecord) return nullptr;
  auto& thread = thread_ref(state);
  if (fn.scope() == at::RecordScope::USER_SCOPE) {  // a record_function region: no frame (its end may come out of order)
    if (staging() && !thread.in_hook && reshards_next(fn.name())) stage_kept_now(thread);
    return nullptr;
  }
  auto opened = thread.frames.size();
  auto context = enter(fn, thread);
  if (stage_due && !thread.in_hook) stage_kept_now(thread);
  if (sweep_due.load(std::memory_order_relaxed) && !thread.in_hook) {
    sweep_due.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(recorder.mutex);
    recorder.sweep();
  }
  if (thread.frames.size() > opened && compiled_scope(fn.name())) {
    thread.frames.back().compiled = true;
    ++compiled_scopes;
  }
  return context;
}

std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn, ThreadState& thread) {
  if (outputs_waiting.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    recorder.slots.hold_waiting();
    outputs_waiting.store(false, std::memory_order_relaxed);
  }
  if (thread.detached_row >= 0 && !thread.in_hook) settle_detached(thread);  // (a hook's ops: before the next op's)
  if (thread.in_hook || thread.compiling > 0) {
    thread.frames.push_back({kHidden, false, false, -1});
    return nullptr;
  }
  if (std::strncmp(fn.name(), kEvaluateFunction, sizeof(kEvaluateFunction) - 1) == 0) {
    // The engine holds the node as current before it opens this scope: the node's number marks the
    // evaluation's ops, the gradient hooks' it runs before the apply included.
    auto node = torch::autograd::get_current_node();
    const char* node_name = fn.name() + sizeof(kEvaluateFunction) - 1;
    thread.frames.push_back({kBackward, false, false, -1});
    thread.node_seq.push_back(node ? static_cast<int64_t>(node->sequence_nr()) : -1);
    thread.node_checkpoint.push_back(!reentrant_node.empty() && reentrant_node == node_name ? kCheckpointNode : 0);
    auto context = accumulation_context(node.get(), node_name);
    if (context >= 0) {
      thread.frames.back().accumulation = true;
      thread.accumulations.push_back(context);
    }
    return nullptr;
  }
  Frame* parent = enclosing_op(thread);
  if (parent != nullptr && parent->kind == kHidden) {  // inside a hidden op (before the thread's keys and modes are asked)
    thread.frames.push_back({kHidden, false, false, -1});
    return nullptr;
  }
  bool excluded = c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python);
  bool transform = !excluded && in_transform();
  bool modes = c10::impl::TorchDispatchModeTLS::stack_len() > 0;
  if (excluded || transform || (modes && infra_modes() > 0)) {
    if (transform && (parent == nullptr || parent->kind != kHidden)) hidden_in_transforms.fetch_add(1, std::memory_order_relaxed);
    thread.frames.push_back({kHidden, false, false, -1});  // out of a dispatch mode's sight, or inside another's
    return nullptr;
  }
  if (parent != nullptr && parent->kind == kRecorded && !parent->live && !math_bit_clone(*parent, fn)) {
    thread.frames.push_back({kHidden, false, false, -1});  // inside a kernel below autograd
    return nullptr;
  }
  // A dispatch mode entered after the observer started (selective checkpointing's, a user's) sits
  // above where a capture mode would: that mode sees the calls the handler makes, with the mode
  // popped meanwhile (and the ops those calls are made of), not this one, which is transparent
  // (kModeCall: the handler's call of the same op takes its node's sequence number, which links a
  // backward row to it and a recomputation's saved tensors to the call that saved them).
  if (modes && user_modes() > outer_modes) {
    auto called = op_info(fn).id;
    if (called < 0) {  // (torch's scope around the handler's call, PythonDispatchMode)
      thread.frames.push_back({kTransparent, false, false, -1});
      return nullptr;
    }
    thread.frames.push_back({kModeCall, false, false, -1});
    thread.mode_calls.emplace_back(called, fn.seqNr(), static_cast<int64_t>(at::sequence_number::peek()) - 1);
    return nullptr;
  }
  auto inputs = fn.inputs();
  auto keys = live_keys(inputs);
  bool live = keys.has_any(c10::autograd_dispatch_keyset);
  // A factory (no tensor argument) that a pending composite calls where the thread excludes no
  // autograd key runs in its decomposition above autograd (value_selecting_reduction_backward's zeros).
  bool above = live || (parent != nullptr && parent->kind == kPending && no_tensor_argument(inputs) &&
                        !c10::impl::tls_local_dispatch_key_set().excluded_.has_any(c10::autograd_dispatch_keyset));
  bool materializing = parent != nullptr && !above && math_bit_clone(*parent, fn);
  if (materializing) --parent->materializes;  // recorded before the parent (deferred below), as a mode sees it
  if (parent != nullptr && !above && !materializing) {  // the parent's kernel below autograd runs this op: hidden
    if (parent->kind == kPending || parent->kind == kDeferred) settle(thread, *parent, true);
    parent->below = true;
    thread.frames.push_back({kHidden, false, false, -1});
    return nullptr;
  }
  if (parent != nullptr && parent->kind == kPending) {  // it decomposed above autograd: a part of it
    parent->kind = kTransparent;
    pop_stash(thread);
  } else if (parent != nullptr && parent->kind == kRecorded && !parent->below && reads_inputs_of(*parent, inputs)) {
    defer(thread, *parent);  // its autograd kernel runs this op before the parent goes below
  }
  if (thread.node_seq.empty() && std::this_thread::get_id() != owner) {  // an intra-op worker thread
    thread.frames.push_back({kHidden, false, false, -1});
    return nullptr;
  }
  auto info = op_info(fn);
  if (info.kind == kAutogradOnly && live) {
    thread.frames.push_back({kHidden, false, false, -1});
    return nullptr;
  }
  // An autocast kernel casts the arguments and calls the op again with autocast excluded: a
  // dispatch mode sees that call (and the casts), not this one.
  if (info.kind == kNotOp || (info.kind == kComposite && live) || keys.has_any(info.autocast)) {
    thread.frames.push_back({kTransparent, live, false, -1});
    return nullptr;
  }
  if (collectives_pending.load(std::memory_order_relaxed)) complete_collectives(false);  // before this op's slots
  bool in_backward = !thread.node_seq.empty();
  Row row{info.id, in_backward ? thread.node_seq.back() : fn.seqNr(), static_cast<int8_t>(in_backward), row_context(thread), -1};
  row.mark = static_cast<int8_t>((at::GradMode::is_enabled() ? kGradOn : 0) | (in_backward ? thread.node_checkpoint.back() : 0) |
                                 (compiled_scopes > 0 ? kCompiled : 0));
  row.made = static_cast<int64_t>(at::sequence_number::peek()) - 1;
  if (!thread.mode_calls.empty() && std::get<0>(thread.mode_calls.back()) == info.id) {  // a mode's handler calling its op
    if (!in_backward) row.seq = std::get<1>(thread.mode_calls.back());
    row.made = std::get<2>(thread.mode_calls.back());
  }
  if (info.kind == kMaybeComposite && live) {  // its frames are taken if it is recorded (settle)
    bool subclasses = keys.has(c10::DispatchKey::Python);
    if (subclasses) find_subclasses(inputs, thread.in_hook);
    auto& stash = push_stash(thread);
    stash.row = std::move(row);
    auto* args = want_values.load(std::memory_order_relaxed) ? info.args : nullptr;
    stash.slots.add_all(-1, 0, inputs, args);
    if (writes_unreturned(info)) note_written(thread.written_args, thread.frames.size(), info, inputs);
    if (watch::on.load(std::memory_order_relaxed)) {
      if (info.mutable_op) watch::copy_written(thread.written_copies, thread.frames.size(), info, inputs);
      watch::hold_inputs(thread.held_inputs, thread.frames.size(), inputs);
    }
    if (subclasses) plain_of.clear();
    if (info.mutable_op) forget_reads_of(inputs);
    thread.frames.push_back({kPending, live, false, -1, args, info.frame_op, info.args != nullptr && !info.args->outputs.empty()});
    thread.frames.back().factory = no_tensor_argument(inputs);
    thread.frames.back().writes = note_writes(thread, info, inputs);
    snapshot_written(stash.slots, thread, thread.frames.back().writes);
    if (thread.frames.back().writes >= 0) {
      std::lock_guard<std::mutex> lock(recorder.mutex);
      snapshot_written(recorder.slots, thread, thread.frames.back().writes);
    }
    return nullptr;
  }
  if (info.grouped != 0) {
    auto owned = owner_context(info.grouped, thread.in_hook);
    if (owned != kNotOwned) row.module = owned;
  }
  row.stack = python_frames(frames_wanted(thread, row, info.frame_op));
  bool subclasses = keys.has(c10::DispatchKey::Python);
  if (subclasses) find_subclasses(inputs, thread.in_hook);
  std::lock_guard<std::mutex> lock(recorder.mutex);
  auto at_row = recorder.add_row(std::move(row));
  auto* args = want_values.load(std::memory_order_relaxed) ? info.args : nullptr;
  auto first_input = recorder.slots.row.size();
  recorder.slots.add_all(at_row, 0, inputs, args);
  if (writes_unreturned(info)) note_written(thread.written_args, thread.frames.size(), info, inputs);
  if (watch::on.load(std::memory_order_relaxed)) {
    if (info.mutable_op) watch::copy_written(thread.written_copies, thread.frames.size(), info, inputs);
    watch::hold_inputs(thread.held_inputs, thread.frames.size(), inputs);
    if (subclasses) watch::note_plains(first_input);
  }
  if (subclasses) plain_of.clear();
  if (info.mutable_op) forget_reads_of(inputs);
  if (info.detach && live && parent != nullptr && parent->kind == kRecorded && !inputs.empty() && inputs[0].isTensor()) {
    thread.saved.emplace_back(static_cast<size_t>(parent - thread.frames.data()), inputs[0]);  // (saved_outputs)
  }
  // (an op with no autograd kernel goes below autograd at once: what it calls is hidden, live or not)
  thread.frames.push_back({kRecorded, live && info.kind != kNoAutograd, false, at_row, args, info.frame_op,
                           info.args != nullptr && !info.args->outputs.empty()});
  if (watch::on.load(std::memory_order_relaxed) && !watch::unwritten.empty()) thread.frames.back().unwritten_inputs = watch::unwritten_inputs(first_input);
  thread.frames.back().factory = no_tensor_argument(inputs);
  thread.frames.back().writes = note_writes(thread, info, inputs);
  snapshot_written(recorder.slots, thread, thread.frames.back().writes);
  if (materializing) thread.frames.back().cloned = inputs[0].unsafeToTensorImpl();  // (fn.inputs() lives only through on_enter)
  thread.frames.back().functional = info.functional;
  thread.frames.back().detach = info.detach && !keys.has(c10::DispatchKey::Python);  // (a subclass's detach returns one)
  if (info.collective) {
    auto waits = info.async_arg >= 0 && static_cast<size_t>(info.async_arg) < inputs.size() ? inputs[info.async_arg] : c10::IValue();
    thread.frames.back().collective = true;
    if (info.writes_first && !inputs.empty()) snapshot_collective(recorder.slots, inputs[0]);
    thread.collective_calls.emplace_back(waits.isBool() && !waits.toBool(), info.receives && !inputs.empty() ? inputs[0] : c10::IValue());
  }
  if (keys.has_any(kMathBits)) {
    thread.frames.back().materializes = math_bit_arguments(inputs);
    thread.frames.back().math_bits = thread.frames.back().materializes > 0;
    if (thread.frames.back().math_bits) thread.math_bit_calls.emplace_back(inputs.begin(), inputs.end());
  }
  return nullptr;
}

// The math-bit fallback's clone of `original` ended: the op it was made for (deferred, its row
// waiting in the innermost stash) reads the clone in that argument's place, as a dispatch mode sees it.
void read_clone_instead(ThreadState& thread, const c10::TensorImpl* original, const std::vector<c10::IValue>& outputs) {
  Frame* parent = enclosing_op(thread);
  if (parent == nullptr || parent->kind != kDeferred || !parent->math_bits || thread.stashed == 0 || outputs.empty() ||
      !outputs[0].isTensor()) {
    return;  // (another thread's rows kept the parent from being deferred: it stays before the clone)
  }
  auto& arguments = thread.math_bit_calls.back();
  for (auto& value : arguments) {  // the first left: the fallback clones them in order, one a time (mul(x, x))
    if (value.isTensor() && value.unsafeToTensorImpl() == original) {
      value = outputs[0];
      break;
    }
  }
  auto& stash = thread.stashes[thread.stashed - 1];
  stash.slots.clear();
  stash.slots.add_all(-1, 0, c10::ArrayRef<const c10::IValue>(arguments.data(), arguments.size()), parent->args);
}

// What a recorded op returned, where it raised after its kernel ran: checkpoint's early stop raises
// from the saved-tensors hook of an output, in the op's autograd kernel, once the recomputation saved
// its last tensor. A dispatch mode, below autograd, saw the kernel return; the RecordFunction ends with
// no outputs. The hook detached each output that requires grad (a live detach inside the op, of a
// tensor whose node is the one this op made): where that gives every output the schema returns (relu,
// softmax, tanh: one saved result), they are the op's outputs; else none (layer norm's mean and rstd
// require no grad, dropout's output is not saved).
std::vector<c10::IValue> saved_outputs(const ThreadState& thread, size_t frame_at, const at::RecordFunction& fn) {
  std::vector<c10::IValue> outputs;
  auto first = thread.saved.size();
  while (first > 0 && thread.saved[first - 1].first == frame_at) --first;
  auto schema = fn.operator_schema();
  auto seq = fn.seqNr();  // the number its node takes
  if (first == thread.saved.size() || !schema.has_value() || seq < 0) return outputs;
  outputs.resize(schema->returns().size());
  for (auto i = first; i < thread.saved.size(); ++i) {
    const auto& tensor = thread.saved[i].second.toTensor();
    auto* node = tensor.grad_fn().get();
    auto index = static_cast<size_t>(tensor.output_nr());
    if (node != nullptr && static_cast<int64_t>(node->sequence_nr()) == seq && index < outputs.size()) outputs[index] = tensor;
  }
  for (const auto& output : outputs) {
    if (!output.isTensor()) return {};
  }
  return outputs;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (level.load(std::memory_order_relaxed) != kRecord || fn.scope() == at::RecordScope::USER_SCOPE) return;
  auto& thread = thread_ref(state);
  if (thread.frames.empty()) return;  // entered before the observer started
  auto& last = thread.frames.back();
  if ((last.kind == kPending || last.kind == kDeferred) && last.returns && fn.outputs().empty()) {
    pop_stash(thread);  // it raised before reaching below autograd (a saved-tensors hook's): no dispatch mode saw it
    last.kind = kHidden;
  } else if (last.kind == kPending || last.kind == kDeferred) {
    settle(thread, last, false);  // ran nothing more
  }
  auto frame = last;
  thread.frames.pop_back();
  // task="overflow_check": what this call writes, as it started, and its arguments
  auto copies = take_frame(thread.written_copies, thread.frames.size());
  auto arguments = take_frame(thread.held_inputs, thread.frames.size());
  auto written_outputs = take_frame(thread.written_args, thread.frames.size());  // (any task)
  std::vector<c10::IValue> saved;  // where the op raised after its kernel: what it returned (saved_outputs)
  if (!thread.saved.empty() && thread.saved.back().first >= thread.frames.size()) {
    if (frame.kind == kRecorded && frame.returns && fn.outputs().empty()) saved = saved_outputs(thread, thread.frames.size(), fn);
    while (!thread.saved.empty() && thread.saved.back().first >= thread.frames.size()) thread.saved.pop_back();
  }
  if (frame.compiled) compiled_scopes = std::max(compiled_scopes - 1, 0);
  if (frame.math_bits) thread.math_bit_calls.pop_back();
  std::optional<std::pair<bool, c10::IValue>> collective_call;  // (a c10d op's: no IValue made for the others)
  if (frame.collective) {
    collective_call.emplace(std::move(thread.collective_calls.back()));
    thread.collective_calls.pop_back();
  }
  if (frame.writes >= 0) {  // before its outputs: a written argument it returns holds the written value
    if (frame.kind == kRecorded) count_unmoved(thread, frame.writes);
    thread.writes.resize(static_cast<size_t>(frame.writes));
  }
  if (frame.kind == kBackward) {
    thread.node_seq.pop_back();
    thread.node_checkpoint.pop_back();
    if (frame.accumulation) thread.accumulations.pop_back();
  } else if (frame.kind == kModeCall) {
    thread.mode_calls.pop_back();
  } else if (frame.kind == kRecorded) {
    const auto& outputs = saved.empty() ? fn.outputs() : saved;
    c10::ArrayRef<const c10::IValue> returned(outputs.data(), outputs.size());
    std::vector<c10::IValue> written;  // what a call that returns nothing wrote: its outputs
    for (auto& [depth, position, element, weak] : written_outputs) {
      auto impl = weak.lock();
      written.emplace_back(impl ? at::Tensor(std::move(impl)) : at::Tensor());
    }
    c10::ArrayRef<const c10::IValue> wrote(written.data(), written.size());
    std::optional<PlainFound> plain_found;  // (plain_of is empty but while a subclass's slots are added)
    if (any_subclass(returned) || any_subclass(wrote)) {
      std::vector<c10::IValue> both(returned.begin(), returned.end());
      both.insert(both.end(), written.begin(), written.end());
      find_subclasses(c10::ArrayRef<const c10::IValue>(both.data(), both.size()), thread.in_hook);
      plain_found.emplace();
    }
    std::lock_guard<std::mutex> lock(recorder.mutex);
    auto& slots = recorder.slots;
    if (frame.returns && outputs.empty() && frame.live && !frame.below && !thread.node_seq.empty() && at::GradMode::is_enabled() &&
        frame.row == recorder.first_row + static_cast<int64_t>(recorder.op.size()) - 1) {
      // It raised with nothing run inside it, in a recomputation (grad mode on in a backward): in
      // its autograd kernel before the redispatch, where checkpoint's early stop raises from the
      // saved-tensors hook of an input, so no dispatch mode saw it. (Raised from an output's hook,
      // after its kernel, the hook's detach of the output ran inside it: the mode saw it whole,
      // saved_outputs.)
      thread_local Slots dropped;
      recorder.pop_row();
      slots.move_tail(frame.row, dropped);
      dropped.clear();
      return;
    }
    auto at = frame.row - recorder.first_row;
    if (at >= 0 && at < static_cast<int64_t>(recorder.seq.size()) && !recorder.backward[at] && recorder.seq[at] >= 0 &&
        at::sequence_number::peek() <= static_cast<uint64_t>(recorder.seq[at])) {
      recorder.mark[at] |= kNoNode;
    }
    slots.outputs_wait = frame.factory;
    auto after = slots.row.size();  // the slots of rows recorded inside this op (after its redispatch)
    while (after > 0 && slots.row[after - 1] > frame.row) --after;
    if (frame.functional != 0) note_in_flight(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()), frame.functional);
    if (frame.collective) {
      end_collective(frame.row, std::move(*collective_call), outputs, frame.args);
    } else if (after == slots.row.size()) {
      slots.add_all(frame.row, 1, c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()), frame.args);
      for (size_t at = 0; at < written.size(); ++at) {
        if (is_tensor(written[at])) slots.add(frame.row, 1, std::get<1>(written_outputs[at]), std::get<2>(written_outputs[at]), written[at].unsafeToTensorImpl());
      }
    } else {  // a dispatch mode saw this op's outputs before them (a saved-tensors hook's detach of an output)
      slots.hold_waiting();
      Slots inside;
      slots.move_from(after, inside);
      slots.add_all(frame.row, 1, c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()), frame.args);
      slots.hold_waiting();
      slots.append(inside, -1);
    }
    if (!slots.waiting.empty()) outputs_waiting.store(true, std::memory_order_relaxed);
    if (frame.detach && outputs.size() == 1 && outputs[0].isTensor()) {
      thread.detached = WeakImpl::reclaim_copy(outputs[0].unsafeToTensorImpl());
      thread.detached_row = frame.row;
    }
  }
  if (frame.kind == kRecorded && frame.cloned != nullptr) read_clone_instead(thread, frame.cloned, fn.outputs());  // (the lock let go)
  if (frame.kind == kRecorded && !frame.collective && frame.functional == 0 && !thread.in_hook && watch::on.load(std::memory_order_relaxed)) {
    watch::judge(thread, frame, copies, arguments);
  }
  // Staged at every op (stage_bytes 0: tests), and at each op of compiled code: its outputs now,
  // before code no op shows writes their memory (inductor's kernels between its extern ops).
  if (stage_due && !thread.in_hook && (stage_bytes.load(std::memory_order_relaxed) == 0 || compiled_scopes > 0)) stage_kept_now(thread);
}

// ---- the alternative observation point, measured by bench/observation_point.py -----------------
// A boxed fallback on DispatchKey::Fake, a functionality key below autograd that torch reserves for
// a C++ FakeTensor mode and that has no kernel and no fallback in 2.11-2.14 (it may get one). Put in
// the thread's included keys, every op reaching below autograd passes through it, as through the
// Python key of a dispatch mode; the ops it runs inside are not seen again (Fake excluded meanwhile).
// It records op and slot rows (no sequence numbers, no backward scopes): enough to weigh its cost.

std::optional<c10::RegistrationHandleRAII> fallback_registration;
bool fallback_records = false;

void fallback_observe(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  int64_t at_row = -1;
  auto arguments = op.schema().arguments().size();
  if (fallback_records) {
    auto name = op.schema().name().c_str();
    std::lock_guard<std::mutex> lock(recorder.mutex);
    auto found = recorder.ops.find(name);
    if (found == recorder.ops.end()) {
      found = recorder.ops.emplace(name, OpInfo{static_cast<int32_t>(recorder.names.size()), kOp}).first;
      recorder.names.push_back(overload_name(op.operator_name()));
    }
    at_row = recorder.add_row(Row{found->second.id, -1, 0, module_context.load(std::memory_order_relaxed), -1});
    recorder.slots.add_all(at_row, 0, c10::ArrayRef<const c10::IValue>(stack->data() + stack->size() - arguments, arguments));
  }
  {
    c10::impl::ExcludeDispatchKeyGuard inside(c10::DispatchKey::Fake);
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
  }
  if (fallback_records) {
    auto returns = op.schema().returns().size();
    std::lock_guard<std::mutex> lock(recorder.mutex);
    recorder.slots.add_all(at_row, 1, c10::ArrayRef<const c10::IValue>(stack->data() + stack->size() - returns, returns));
  }
}

// At a drain with no stash in use (a stash's slots may name a key no map shows), forget the
// generations of the addresses whose current key no hold and no slot left after the `drained` names,
// which bounds them by what is held: the keys before theirs were retired, and the walk lets them go
// with the freed of this drain or an earlier one (and so this one, if it was used).
void prune_generations(size_t drained) {
  if (generations.empty() || stashes_in_use.load(std::memory_order_relaxed) != 0) return;
  AddressMap<bool> left;
  const auto& slots = recorder.slots;
  for (size_t slot = drained; slot < slots.row.size(); ++slot) {
    for (auto key : {slots.value[slot], slots.storage[slot], slots.base[slot]}) {
      if (key != 0) left.insert(key);
    }
  }
  generations.erase_if([&](int64_t address, int64_t generation) {
    auto key = address | generation << kGenerationShift;
    return !recorder.seen.contains(key) && !recorder.seen_storages.contains(key) && !left.contains(key);
  });
}

template <typename T>
void take(std::vector<T>& column, size_t count, void* into) {
  if (count != 0) std::memcpy(into, column.data(), count * sizeof(T));  // (an empty column's address is 0)
  column.erase(column.begin(), column.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace

extern "C" {

// Start observing on this thread (and the threads its autograd graph tasks run on): level 2
// records; levels 0 and 1 register callbacks that do nothing (measurements). Returns 0 when already
// started.
int td_observer_start(int requested_level) {
  if (handle != 0 || modules_only.load()) return 0;
  level.store(requested_level);
  owner = std::this_thread::get_id();
  state = ThreadState{};
  compiled_scopes = 0;
  hidden_in_transforms.store(0);
  outer_modes = user_modes();
  forget_reads();
  {
    std::lock_guard<std::mutex> lock(collectives_mutex);
    pending_collectives.clear();  // (a capture stopped without finishing them)
    collectives_pending.store(false);
  }
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex);
    in_flight_storages.clear();
    functional_outputs.clear();
    in_flight_any.store(false);
  }
  if (requested_level == kModuleRows) {
    modules_only.store(true);
    return 1;
  }
  bool values = requested_level != kEmpty;
  handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                          .needsInputs(values)
                                          .needsOutputs(values)
                                          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  return 1;
}

void td_observer_stop() {
  if (handle == 0 && !modules_only.load()) return;
  if (handle != 0) at::removeCallback(handle);
  handle = 0;
  modules_only.store(false);
  if (state.detached_row >= 0) settle_detached(state);
  state = ThreadState{};
}

// The fallback alternative: 0 passes ops through, 1 records them too. Returns 0 when the Fake key
// already has a fallback (torch registered one) or this one is registered.
int td_fallback_start(int records) {
  if (fallback_registration.has_value() || c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::Fake)) {
    return 0;
  }
  fallback_records = records != 0;
  fallback_registration.emplace(c10::Dispatcher::singleton().registerFallback(
      c10::DispatchKey::Fake, c10::KernelFunction::makeFromBoxedFunction<&fallback_observe>(), "torchdebug observer"));
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
  return 1;
}

void td_fallback_stop() {
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, false);
  fallback_registration.reset();
}

// Dynamo starts (1) or ends (0) a compilation on the calling thread: the ops it runs meanwhile (AOT
// autograd's copy of the RNG state, a backend's runs of the graph) are the compiler's, which a dispatch
// mode does not see either (Dynamo takes the modes off while it compiles).
void td_observer_compiling(int starts) { state.compiling = starts ? state.compiling + 1 : std::max(state.compiling - 1, 0); }

// Where the module context is kept, for Python to store into (module_context).
std::atomic<int64_t>* td_observer_module_context() { return &module_context; }

// The parameters whose gradient accumulations are named (see parameter_context): `count` TensorImpl
// addresses and their contexts, in place of those set before.
void td_observer_parameters(int64_t count, const int64_t* impls, const int64_t* contexts) {
  std::lock_guard<std::mutex> lock(parameters_mutex);
  parameter_context.clear();
  for (int64_t index = 0; index < count; ++index) {
    parameter_context[reinterpret_cast<const c10::TensorImpl*>(impls[index])] = contexts[index];
  }
}

// Whether this thread runs a named parameter's gradient accumulation now (its hooks: an optimizer
// stepped in the backward keeps the parameter's context).
int td_observer_accumulating() { return state.accumulations.empty() ? 0 : 1; }

// A module call's tensors (capture/native_modules.py, levels "mix" and "module"): a row of their own between the
// ops, of the op named kModuleOp, each tensor an input slot at position 0, element its index (up to
// 32767), so that they take value ids, statistics and fingerprints as the step's op slots do, in the
// step's order. `count` TensorImpl addresses (Tensor._cdata), which the caller holds meanwhile.
// Returns the row's absolute number, or -1 when the observer is not started (at any level but the
// measurements' kEmpty ones); *slot_at: where its
// slots start among those the next drain hands over (the slots buffered before them).
constexpr char kModuleOp[] = "torchdebug.module";

int64_t td_observer_module_row(int64_t count, const int64_t* impls, int64_t* slot_at) {
  if ((handle == 0 && !modules_only.load()) || count < 0 || count > INT16_MAX) return -1;
  auto& thread = thread_ref(state);
  std::vector<c10::IValue> values;
  values.reserve(static_cast<size_t>(count));
  bool subclasses = false;
  for (int64_t index = 0; index < count; ++index) {
    auto* impl = reinterpret_cast<c10::TensorImpl*>(impls[index]);
    subclasses = subclasses || impl->key_set().has(c10::DispatchKey::Python);
    values.emplace_back(at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl)));
  }
  if (subclasses) find_subclasses(c10::ArrayRef<const c10::IValue>(values.data(), values.size()), thread.in_hook);
  if (collectives_pending.load(std::memory_order_relaxed)) complete_collectives(false);  // before this row's slots, as an op's
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (sweep_due.load(std::memory_order_relaxed)) {  // (at level module no op starts: a module call sweeps)
    sweep_due.store(false, std::memory_order_relaxed);
    recorder.sweep();
  }
  static int32_t module_op = -1;  // an op id of its own, with no schema (ids never move)
  if (module_op < 0) {
    module_op = static_cast<int32_t>(recorder.names.size());
    recorder.names.emplace_back(kModuleOp);
    recorder.args.emplace_back();
    recorder.written.emplace_back();
  }
  auto at_row = recorder.add_row(Row{module_op, -1, 0, -1, -1, kNoNode, -1});
  *slot_at = static_cast<int64_t>(recorder.slots.row.size());
  for (int64_t index = 0; index < count; ++index) {
    recorder.slots.add(at_row, 0, 0, static_cast<int16_t>(index), values[static_cast<size_t>(index)].unsafeToTensorImpl());
  }
  if (subclasses) plain_of.clear();
  return at_row;
}

int td_observer_op_names() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  return static_cast<int>(recorder.names.size());
}

const char* td_observer_op_name(int id) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  return recorder.names.at(static_cast<size_t>(id)).c_str();
}

// counts[0..4]: op rows, slot rows, shape entries (and as many stride entries) buffered now, the
// absolute number of the first op row buffered (slot rows refer to op rows by absolute number), and
// the tensors kept for those slots.
void td_observer_counts(int64_t* counts) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  counts[0] = static_cast<int64_t>(recorder.op.size());
  counts[1] = static_cast<int64_t>(recorder.slots.row.size());
  counts[2] = static_cast<int64_t>(recorder.slots.shape.size());
  counts[3] = recorder.first_row;
  counts[4] = static_cast<int64_t>(recorder.slots.kept.size());
}

// Move the first counts[0] op rows, counts[1] slot rows, counts[2] shape and stride entries and
// counts[4] kept tensors (as td_observer_counts gave them) into the 29 columns: Recorder's op
// columns, then its Slots' (the kept tensors' slots, -1 for one freed or changed in place since it
// was recorded, but for a subclass, whose version Python checks; the others go to observer_kept()), then the
// rows' stack ids (td_observer_stack), then the slots' view
// bases, whether each has a fingerprint and the fingerprints, then the rows' marks and the last
// node made before each, then each kept tensor's staging id (-1: handed now); rows added since stay.
// Called between ops: an op still running when its row is drained records its outputs with the next drain.
void td_observer_drain(const int64_t* counts, void** columns) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  auto ops = static_cast<size_t>(counts[0]), slots = static_cast<size_t>(counts[1]);
  auto dims = static_cast<size_t>(counts[2]), kept = static_cast<size_t>(counts[4]);
  auto& from = recorder.slots;
  from.hold_waiting();
  forget_reads();
  forget_unmoved(false);
  take(recorder.op, ops, columns[0]);
  take(recorder.seq, ops, columns[1]);
  take(recorder.backward, ops, columns[2]);
  take(recorder.module, ops, columns[3]);
  take(recorder.mark, ops, columns[26]);
  take(recorder.made, ops, columns[27]);
  take(recorder.stack, ops, columns[22]);
  recorder.freed.swap(recorder.retired);  // (let go by the sweeps since the last drain)
  recorder.retired.clear();
  auto freed = [](int64_t address, const auto& held) {  // since the last drain
    if (!held.weak.expired()) return false;
    recorder.freed.push_back(address);
    return true;
  };
  recorder.seen.erase_if(freed);
  recorder.seen_storages.erase_if(freed);
  drained_texts.clear();
  std::unordered_map<std::string_view, int64_t> text_codes;  // views into from.text, alive until its erase below
  for (size_t slot = 0; slot < slots; ++slot) {
    if (from.flag[slot] == kValue) {  // its value column: the index of its text among the distinct ones
      auto [found, added] = text_codes.try_emplace(from.text[slot], static_cast<int64_t>(text_codes.size()));
      if (added) {
        drained_texts += from.text[slot];
        drained_texts += '\0';
      }
      from.value[slot] = found->second;
    }
  }
  recorder.hold_slots(0, slots);
  from.text.erase(from.text.begin(), from.text.begin() + static_cast<std::ptrdiff_t>(slots));
  from.alive.erase(from.alive.begin(), from.alive.begin() + static_cast<std::ptrdiff_t>(slots));
  from.base_alive.erase(from.base_alive.begin(), from.base_alive.begin() + static_cast<std::ptrdiff_t>(slots));
  from.storage_alive.erase(from.storage_alive.begin(), from.storage_alive.begin() + static_cast<std::ptrdiff_t>(slots));
  from.swept = from.swept > slots ? from.swept - slots : 0;
  from.unswept_bytes = 0;  // (a drain lets go as a sweep does)
  prune_generations(slots);
  from.sweep_work = recorder.seen.size() + recorder.seen_storages.size() + from.kept_original.size();  // (no read left)
  take(from.base, slots, columns[23]);
  handed.clear();
  for (size_t entry = 0; entry < kept; ++entry) {  // freed before it was held, or changed since: slot -1
    if (from.kept_staged[entry] >= 0) continue;  // staged already: Python has its statistics by that id
    auto& tensor = from.kept[entry];
    auto at = static_cast<size_t>(from.kept_slot[entry]);
    auto recorded = from.version[at];
    auto original = from.kept_original[entry].lock();
    if (tensor.defined() && memory_held(tensor) &&
        (recorded < 0 || !original || Slots::current_version(original.get()) == from.kept_version[entry])) {
      handed.push_back(std::move(tensor));
    } else {
      from.kept_slot[entry] = -1;
    }
  }
  take(from.row, slots, columns[4]);
  take(from.io, slots, columns[5]);
  take(from.arg, slots, columns[6]);
  take(from.element, slots, columns[7]);
  take(from.dtype, slots, columns[8]);
  take(from.flag, slots, columns[9]);
  take(from.ndim, slots, columns[10]);
  take(from.value, slots, columns[11]);
  take(from.version, slots, columns[12]);
  take(from.storage, slots, columns[13]);
  take(from.offset, slots, columns[14]);
  take(from.shape, dims, columns[15]);
  take(from.stride, dims, columns[16]);
  take(from.device_type, slots, columns[17]);
  take(from.device_index, slots, columns[18]);
  take(from.has_stats, slots, columns[19]);
  take(from.stats, slots * kStatsWidth, columns[20]);
  take(from.has_fingerprint, slots, columns[24]);
  take(from.fingerprint, slots, columns[25]);
  take(from.kept_slot, kept, columns[21]);
  take(from.kept_staged, kept, columns[28]);
  for (auto& slot : from.kept_slot) slot -= static_cast<int64_t>(slots);
  kept_bytes.store(0, std::memory_order_relaxed);
  from.kept_version.erase(from.kept_version.begin(), from.kept_version.begin() + static_cast<std::ptrdiff_t>(kept));
  from.kept_original.erase(from.kept_original.begin(), from.kept_original.begin() + static_cast<std::ptrdiff_t>(kept));
  from.kept.erase(from.kept.begin(), from.kept.begin() + static_cast<std::ptrdiff_t>(kept));
  from.kept_dropped_before(kept);
  watch::hand_over(slots, recorder.first_row + static_cast<int64_t>(ops));
  recorder.first_row += static_cast<int64_t>(ops);
}

// The distinct JSON texts of the value slots drained last (a value slot's slot_value indexes them;
// an optimizer's step repeats a few dozen texts a thousand times), each ended by a NUL; *size: their bytes.
const char* td_observer_value_texts(int64_t* size) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  *size = static_cast<int64_t>(drained_texts.size());
  return drained_texts.data();
}

// The addresses of the TensorImpls and StorageImpls drained before and freed since: their number,
// then into out.
int64_t td_observer_freed_count() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  return static_cast<int64_t>(recorder.freed.size());
}

void td_observer_take_freed(int64_t* out) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::copy(recorder.freed.begin(), recorder.freed.end(), out);
  recorder.freed.clear();
}

// Sweep once `bytes` of CPU tensors were recorded since the last sweep (and enough slots; see
// key_of): -1 never, 0 at every op (tests).
void td_observer_sweep_after(int64_t bytes) { sweep_after.store(bytes, std::memory_order_relaxed); }

// The keys of `count` TensorImpl or StorageImpl addresses, in place (Python's: FSDP2's unshard buffers).
void td_observer_keys(int64_t count, int64_t* addresses) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  for (int64_t index = 0; index < count; ++index) addresses[index] = key_of(addresses[index]);
}

// The kept entries the stagings looked at so far (tests: each staging looks at those kept since the
// last one and those left then, not at every entry kept).
int64_t td_observer_stage_looked() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  return stage_looked;
}

// The kept entries the checks before a write (snapshot_kept) looked at so far (tests: those a staging
// may still hold, not every entry kept).
int64_t td_observer_write_looked() { return write_looked.load(); }

// The weak references the recorder holds of tensors and storages, those of its slots since the last
// sweep included, and the keys retired since the last drain (tests: what sweeps let go).
void td_observer_held(int64_t* out) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  const auto& slots = recorder.slots;
  int64_t held = static_cast<int64_t>(recorder.seen.size() + recorder.seen_storages.size());
  for (size_t slot = slots.swept; slot < slots.row.size(); ++slot) {
    held += !refers_to_nothing(slots.alive[slot]) + !refers_to_nothing(slots.base_alive[slot]) + !refers_to_nothing(slots.storage_alive[slot]);
  }
  out[0] = held;
  out[1] = static_cast<int64_t>(recorder.retired.size());
}

// Drop every weak reference the drains took (a new capture names values afresh).
void td_observer_forget_seen() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  recorder.seen.clear();
  recorder.seen_storages.clear();
  recorder.freed.clear();
  recorder.retired.clear();
  recorder.slots.sweep_work = 0;
  generations.clear();
  forget_unmoved(true);
}

// Activation checkpointing: `node`, the name of a reentrant region's autograd node (its ops are
// marked kCheckpointNode), and `ops`, the overloads ("aten.detach.default"), one a line, whose rows
// take their frames to tell checkpoint's own calls (frames_wanted); ops seen before take them too.
// A capture says so before it starts; the same description again changes nothing (another capture
// may be observing: the callback reads both without the lock).
void td_observer_checkpoint(const char* node, const char* ops) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::vector<std::string> listed;
  std::string_view rest(ops);
  while (!rest.empty()) {
    auto end = rest.find('\n');
    listed.emplace_back(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  if (reentrant_node == node && frame_ops == listed) return;
  reentrant_node = node;
  frame_ops = std::move(listed);
  for (auto& [key, info] : recorder.ops) {
    info.frame_op = std::find(frame_ops.begin(), frame_ops.end(), recorder.names[static_cast<size_t>(info.id)]) != frame_ops.end();
  }
  ops_epoch.fetch_add(1, std::memory_order_release);
}

// The op calls hidden inside torch.func transforms since the last call (hidden_in_transforms).
int64_t td_observer_hidden_in_transforms() { return hidden_in_transforms.exchange(0); }

// Take the Python frames of each forward op from the rows recorded from now on (want != 0), or no longer.
void td_observer_want_stacks(int want) { want_stacks.store(want != 0); }

// Record non-tensor arguments and results (value slots) in the rows recorded from now on, or no longer.
void td_observer_want_values(int want) { want_values.store(want != 0); }

// How many stacks there are (python_frames: the ids the rows hold run below it).
int64_t td_observer_stack_count() {
  std::lock_guard<std::mutex> lock(stacks.mutex);
  return static_cast<int64_t>(stacks.frames.size());
}

// Stack `id`: *size words, 1 if its positions are lines (else the offsets of the frames' last
// instructions), then a code object's address (held while the process runs) and its position for
// each frame, innermost first.
const int64_t* td_observer_stack(int64_t id, int64_t* size) {
  std::lock_guard<std::mutex> lock(stacks.mutex);
  const auto& frames = stacks.frames.at(static_cast<size_t>(id));  // a deque's items never move
  *size = static_cast<int64_t>(frames.size());
  return frames.data();
}

// Take the frames' lines as their positions (lines != 0: what Python 3.10 always does), or
// their last instructions' offsets, for the stacks taken from now on; where Python has no
// PyFrame_GetLasti, lines always. Returns whether lines are taken.
int td_observer_take_lines(int lines) {
  positions_are_lines.store(lines != 0 || PyFrame_GetLasti == nullptr);
  return positions_are_lines.load() ? 1 : 0;
}

// Read the frames of the stacks taken from now on with `take` (py_frames.c's td_frames_take), or
// through Python's C API (null).
void td_observer_use_frames(void* take) { frames_take.store(reinterpret_cast<FramesTake>(take)); }

// Keep a reference to each plain tensor whose sums or fingerprint (those asked for) the callback
// does not take (keep != 0), from the rows recorded from now on, or no longer.
void td_observer_keep_unsummed(int keep) { keep_unsummed.store(keep != 0); }

// Python's hook that stages the kept tensors (a callable () -> None that calls observer_stage_kept,
// held by the caller; null: none, each kept tensor copied before a write and read at the drain),
// and the bytes of kept tensors after which they are staged at the next op (-1: only before a write).
void td_observer_stage_kept(void* hook, int64_t bytes) {
  stage_bytes.store(bytes);
  stage_hook.store(hook);
}

// Keep CPU tensors as other devices' are (their statistics staged, not taken in the callback): task="tensor", tests.
void td_observer_defer_cpu(int defer) { defer_cpu.store(defer != 0); }

// The facts of the tensors the last staging handed over (staged_facts: kFactsWidth int64 each), into out.
void td_observer_staged_facts(int64_t* out) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::copy(staged_facts.begin(), staged_facts.end(), out);
}

// task="overflow_check" (the watch namespace): judge each recorded call as it ends, by `verdicts`
// (256 entries: OriginTracker's), `limits` (by ScalarType code, `limit_count` of them: finfo.max,
// +inf where none, NaN for a dtype not judged) and the `given` magnitudes of numbers that count as a
// given limit; `hook` (held by Python): an op id's facts; `fresh`: a check's first start (the facts
// and the unwritten memory known are forgotten). on 0: no longer (what was found is dropped).
void td_observer_watch_overflow(int on, const uint8_t* verdicts, const double* limits, int64_t limit_count, const double* given,
                                int64_t given_count, void* hook, int fresh) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  watch::on.store(false);
  watch::facts_hook.store(on ? hook : nullptr);
  if (fresh) {  // a check's first start: what the last one knew of ops and memory is not its
    watch::facts.clear();
    watch::unwritten.clear();
  }
  watch::plains.clear();
  watch::rows.clear();
  watch::kinds.clear();
  watch::kept_slots.clear();
  watch::kept.clear();
  if (!on) return;
  std::copy(verdicts, verdicts + watch::verdicts.size(), watch::verdicts.begin());
  watch::limits.fill(std::nan(""));
  std::copy(limits, limits + std::min<int64_t>(limit_count, static_cast<int64_t>(watch::limits.size())), watch::limits.begin());
  watch::given.assign(given, given + given_count);
  watch::budget = -1;
  watch::on.store(true);
}

// At most `budget` calls found from now on keep their tensors (-1: all); `reset`: a new step,
// OriginTracker's state afresh.
void td_observer_overflow_step(int64_t budget, int reset) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (reset) watch::made = watch::held = false;
  watch::budget = budget;
}

// `count` storages (by the keys slots name them by) that hold no value of the run until an op writes
// them, each marked by the plain tensor at impls[i] (alive, held by Python meanwhile), as FSDP2's
// copy-in hands out its all-gather buffers: the check does not judge what is read of them (as
// unwritten.py's UnwrittenStorages.add). Nothing while no check watches.
void td_observer_overflow_unwritten(int64_t count, const int64_t* keys, const int64_t* impls) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (!watch::on.load()) return;
  for (int64_t at = 0; at < count; ++at) {
    auto* impl = reinterpret_cast<c10::TensorImpl*>(impls[at]);
    if (impl->is_inference()) continue;
    watch::mark_unwritten(keys[at], impl);
  }
}

// Tests: every copy the check makes fails from now on, as where memory runs out (`fail` 0: no longer).
void td_observer_overflow_copies_fail(int fail) { watch::copies_fail.store(fail != 0); }

// The calls the last drain handed over as found, and the copies kept for their slots: counts[0], counts[1].
void td_observer_overflow_counts(int64_t* counts) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  counts[0] = static_cast<int64_t>(watch::handed_rows.size());
  counts[1] = static_cast<int64_t>(watch::handed_slots.size());
}

// Those calls' rows (absolute) and kinds, and the drained slot of each copy (observer_overflow_kept's order).
void td_observer_overflow_found(int64_t* rows, int8_t* kinds, int64_t* slots) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::copy(watch::handed_rows.begin(), watch::handed_rows.end(), rows);
  std::copy(watch::handed_kinds.begin(), watch::handed_kinds.end(), kinds);
  std::copy(watch::handed_slots.begin(), watch::handed_slots.end(), slots);
}

// c10d_work.cpp's td_work_completed and td_work_wait, and torch.distributed's folder (what a code
// object's co_filename starts with there): a distributed run's collectives are read once their Work
// completes (see Collectives). Nulls: read at their end.
// The hook that describes a subclass instance and gives its plain tensor (find_subclasses): a Python
// callable, held by the caller until it hands another (null: none).
void td_observer_use_subclass_hook(void* hook) { subclass_hook.store(hook); }

// torch's set_eval_frame (a callable: it sets the thread's Dynamo frame callback and returns the one
// it replaces) and None, which the hooks run with (call_hook); held by the caller. Nulls: neither.
void td_observer_use_eval_frame(void* setter, void* none) {
  none_object.store(none);
  eval_frame_setter.store(setter);
}

// torch.Tensor's type object, which a detach called from Python returns (settle_detached).
void td_observer_tensor_type(void* type) { tensor_type.store(type); }

// The hooks that name an FSDP2 group's ops' owners (Owners): Python callables taking no argument
// and returning a module context, held by the caller until it hands others (null: none).
void td_observer_use_owners(void* owner, void* unshard) {
  owner_hook.store(owner);
  unshard_hook.store(unshard);
}

void td_observer_use_works(void* completed, void* wait, const char* folder) {
  std::lock_guard<std::mutex> lock(collectives_mutex);
  work_completed.store(reinterpret_cast<WorkCall>(completed));
  work_wait.store(reinterpret_cast<WorkCall>(wait));
  distributed_dir = folder != nullptr ? folder : "";
}

// Wait for the collectives still in flight and read their outputs (capture is stopping; called on
// the thread that captures, the observer still on, as the dispatch mode's PendingCollectives.finish).
void td_observer_finish_collectives() { complete_collectives(true); }

// Wait for the functional collectives whose outputs were not waited for (called once the observer
// stopped, before the drain: these waits are capture's own, not recorded), and forget them.
void td_observer_finish_functional() {
  std::vector<at::Tensor> outputs;
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex);
    outputs.swap(functional_outputs);
    in_flight_storages.clear();
    in_flight_any.store(false);
  }
  if (outputs.empty()) return;
  auto wait = c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::wait_tensor", "").typed<at::Tensor(const at::Tensor&)>();
  for (const auto& output : outputs) {
    try {
      wait.call(output);
    } catch (...) {  // a failed collective: its outputs are read as they are
    }
  }
}

// The name of a c10::DeviceType code, lower case ("cpu", "cuda").
// The name of layout `code` as Python prints it (a kLaidOut slot's flag less kLaidOut).
const char* td_observer_layout_name(int code) { return layout_name(code); }

const char* td_observer_device_type_name(int type) {
  static std::deque<std::string> names;  // the returned pointers stay valid
  std::lock_guard<std::mutex> lock(recorder.mutex);
  names.push_back(c10::DeviceTypeName(static_cast<c10::DeviceType>(type), true));
  return names.back().c_str();
}

// Take the statistics of CPU tensors with stats.c's entry points td_stats_<suffix> (f32, bf16, f64,
// i64, i32, i16, i8, u8: kSummedTypes' order; all null: not taken) from the rows recorded from now
// on. Returns the sums' width.
int td_observer_use_stats(void* const* entries) {
  forget_reads();
  for (size_t index = 0; index < kSummedTypes.size(); ++index) {
    stats_kernels[index].store(entries == nullptr ? nullptr : reinterpret_cast<StatsKernel>(entries[index]));
  }
  return kStatsWidth;
}

// Take the fingerprint of CPU tensors (torchdebug/checksum.py) from the rows recorded from now on:
// with statistics, in their pass (td_stats_hash_<suffix>, in kSummedTypes' order), else alone
// (td_hash_w1, w2, w4, w8: by element size); null: none taken.
void td_observer_use_fingerprints(void* const* both, void* w1, void* w2, void* w4, void* w8) {
  forget_reads();
  for (size_t index = 0; index < kSummedTypes.size(); ++index) {
    stats_hash_kernels[index].store(both == nullptr ? nullptr : reinterpret_cast<StatsHashKernel>(both[index]));
  }
  hash_kernels[2].store(reinterpret_cast<HashKernel>(w2));
  hash_kernels[4].store(reinterpret_cast<HashKernel>(w4));
  hash_kernels[8].store(reinterpret_cast<HashKernel>(w8));
  hash_kernels[1].store(reinterpret_cast<HashKernel>(w1));  // last: it says whether fingerprints are taken
}

// The c10::ScalarType of the tensor whose TensorImpl is at `impl` (Tensor._cdata).
int td_observer_scalar_type(void* impl) {
  return static_cast<int>(static_cast<c10::TensorImpl*>(impl)->dtype().toScalarType());
}

}  // extern "C"

namespace {

// The tensors td_observer_drain kept for the slots it drained last, in their kept_slot order (the
// slots -1 left out); each is handed once.
std::vector<at::Tensor> observer_kept() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::vector<at::Tensor> out;
  out.swap(handed);
  return out;
}

// The kept tensors not staged yet (of the recorder's slots and of this thread's stashes), each given
// the next id (kept_staged) and let go, or the id of the one of this staging (from a call with
// `first`) that holds its values: Python stages their statistics now, in this order (a
// subclass's plain tensor too, at its op: read_subclasses takes what was staged). Left for the drain:
// one whose tensor changed since it was kept (the drain says so), one still waiting (a factory's output).
std::vector<at::Tensor> observer_stage_kept(int64_t most, bool first) {
  std::vector<at::Tensor> out;
  auto full = [&] { return static_cast<int64_t>(out.size()) >= most; };
  auto& thread = thread_ref(state);
  // Hand over kept entry `entry` (one of a kind staged here, not staged yet) if it is to be staged
  // now, or give it the id of the tensor of this staging that holds its values; false where a later
  // staging may (stage_retry).
  auto take = [&](Slots& slots, size_t entry) {
    auto& tensor = slots.kept[entry];
    auto at = static_cast<size_t>(slots.kept_slot[entry]);
    if (!tensor.defined()) return false;  // (an output waiting to be held)
    auto original = slots.kept_original[entry].lock();
    if (slots.version[at] >= 0 && original && Slots::current_version(original.get()) != slots.kept_version[entry]) return false;
    if (in_flight(tensor.unsafeGetTensorImpl())) return false;  // a collective still writes it: read once final
    if (!memory_held(tensor)) return false;  // freed under it: the drain says so
    uint64_t written = 0;
    {
      std::lock_guard<std::mutex> reads(reads_mutex);
      written = writes_into(tensor.unsafeGetTensorImpl());
    }
    auto key = [&](int64_t value) { return slots.keyed || value == 0 ? value : key_of(value); };  // (a stash's: addresses)
    bool same_values = slots.flag[at] == kPlain && compiled_scopes == 0 && slots.kept_version[entry] != kCopied;
    auto value_key = key(slots.value[at]);
    if (same_values) {
      auto& id = staged_values[StagedValues{value_key, slots.version[at], static_cast<int64_t>(written)}];
      if (id > 0) {  // (ids from 1 in the map: 0 is a new entry's)
        slots.kept_staged[entry] = id - 1;
        tensor = at::Tensor();
        return true;
      }
      id = staged_count + 1;
    }
    slots.kept_staged[entry] = staged_count++;
    const auto* impl = tensor.unsafeGetTensorImpl();
    bool readable = slots.flag[at] == kPlain && impl->has_storage() && !impl->is_meta() && tensor.layout() == at::kStrided;
    auto device = tensor.device();
    staged_facts.insert(
        staged_facts.end(),
        {value_key, slots.version[at], key(slots.base[at]), int64_t{same_values}, static_cast<int64_t>(written),
         readable ? reinterpret_cast<int64_t>(tensor.const_data_ptr()) : 0, tensor.numel(),
         static_cast<int64_t>(tensor.scalar_type()),
         static_cast<int64_t>(device.type()) << 8 | (device.index() + 1),
         readable ? int64_t{impl->is_non_overlapping_and_dense()} | int64_t{impl->is_contiguous()} << 1 : 0});
    out.push_back(std::move(tensor));
    tensor = at::Tensor();
    return true;
  };
  // The entries left before (in order, all before stage_scan), then those kept since, until `most`
  // are handed over (the next call goes on from there).
  auto take_from = [&](Slots& slots) {
    auto& retry = slots.stage_retry;
    size_t left = 0, at = 0;
    for (; at < retry.size() && !full(); ++at) {
      ++stage_looked;
      if (!take(slots, retry[at])) retry[left++] = retry[at];
    }
    for (; at < retry.size(); ++at) retry[left++] = retry[at];
    retry.resize(left);
    for (; slots.stage_scan < slots.kept.size() && !full(); ++slots.stage_scan) {
      ++stage_looked;
      auto entry = slots.stage_scan;
      auto flag = slots.flag[static_cast<size_t>(slots.kept_slot[entry])];
      if (slots.kept_staged[entry] >= 0 || (flag != kPlain && flag != kSubclass)) continue;  // (never staged here)
      if (!take(slots, entry)) slots.stage_retry.push_back(entry);
    }
  };
  std::lock_guard<std::mutex> lock(recorder.mutex);
  staged_facts.clear();
  if (first) staged_values.clear();
  take_from(recorder.slots);
  for (size_t stash = 0; stash < thread.stashed; ++stash) take_from(thread.stashes[stash].slots);
  kept_bytes.store(0, std::memory_order_relaxed);
  return out;
}

// The copies of the tensors of the calls found (td_observer_overflow_found), each handed once.
std::vector<at::Tensor> observer_overflow_kept() {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  std::vector<at::Tensor> out;
  out.swap(watch::handed);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchdebug, library) {
  library.def("observer_overflow_kept() -> Tensor[]", &observer_overflow_kept);
  library.def("observer_kept() -> Tensor[]", &observer_kept);
  library.def("observer_stage_kept(int most, bool first) -> Tensor[]", &observer_stage_kept);
}
