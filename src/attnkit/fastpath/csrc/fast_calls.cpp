// The memo of attnkit.attention's eager calls, compiled: the call signature's key, its lookup,
// and for a plain SDPA problem the fused-kernel layout test, the forced kernel's enable-flags
// and the SDPA call itself, with no Python in between. Built and loaded by
// attnkit.fastpath.loader; attnkit.api keeps its Python memo behind this one, for every call
// this one does not take. It reads only the typed fields of attnkit.prepared.PreparedRun.
//
// Why: on an H100 host (torch 2.11) a Python layer that validates a call before SDPA costs
// 7-12 us with gradients (the 13-part key and its lookup, three stride() and three data_ptr(),
// measured one step at a time). Here the same work is a few hundred nanoseconds of C++, and the
// Python left is attention()'s own frame.
//
// What this file decides is only what the Python memo decides, read from the same things:
//   * which calls have a key (api.attention's conditions, one for one: exact tensors here, so
//     that a Tensor subclass keeps its __torch_function__);
//   * which operands SDPA's fused kernels may read as they are (attnkit.sdpa.layout's rule;
//     any operand the rule would copy is handed to the Python run, which copies it);
//   * whether a call records a backward (attnkit.flash_autograd.flash_attention's test).
// tests/correctness/test_fastpath_parity.py runs both languages over one table per rule.
// Anything it does not take it hands back (None) or to the entry's Python run, never decides.
//
// A run whose forward without gradients is a fixed list of Triton launches (the Triton path)
// describes them per layout as a NativeProgram (attnkit.triton.native_launch, which says how they
// mirror triton 3.6's launcher); a call of a kept layout then allocates the outputs and makes
// the launches here, through the CUDA driver's cuLaunchKernelEx, after asking each launch's
// `ready()` whether Triton's knobs, hooks and the kernel's globals still allow it.

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <dlfcn.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// The format of what this reads off a PreparedRun (attnkit.prepared: `run`, `plain_sdpa_call`,
// and the NativeProgram / NativeLaunch tuples `native_forward` returns); the loader refuses a
// module whose format differs from the one it writes.
constexpr long kSpecFormat = 3;
// Layouts (q, k, v strides) whose native program an entry keeps; the oldest goes first.
constexpr size_t kProgramsPerEntry = 8;
// As many entries as the Python memo keeps; cleared when full, like it.
constexpr size_t kCapacity = 4096;

// q, k, v sizes (12), dtypes (3), devices (3), causal, scale (given, bits), window (given,
// left, right), backend id.
constexpr int kKeyWords = 25;
using Key = std::array<int64_t, kKeyWords>;

struct KeyHash {
  size_t operator()(const Key& key) const noexcept {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a over the words
    for (int64_t word : key) {
      h ^= static_cast<uint64_t>(word);
      h *= 1099511628211ULL;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// The SDPA call a plain problem's run makes (attnkit.prepared.PlainSdpaCall).
struct PlainCall {
  bool forced = false;
  std::array<bool, 5> kernels{};  // flash, efficient, math, cudnn, overrideable
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
  bool layout = false;  // apply the fused-kernel layout test (CUDA, not math)
  int64_t item = 0;
  int64_t head_dim = 0;
  int64_t value_dim = 0;
};

// The CUDA driver's launch config and attribute (cuda.h: CUlaunchConfig, CUlaunchAttribute),
// declared here so that the extension builds without CUDA's headers. Their layout has been
// fixed since CUDA 12.0 (sizes and offsets as in cuda.h 12.x).
struct LaunchAttribute {
  uint32_t id;
  uint32_t pad;
  union {
    int32_t flag;
    char bytes[64];
    void* align;
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
struct LaunchConfig {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  void* stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, stream) == 32, "CUlaunchConfig layout");
constexpr uint32_t kAttributeCooperative = 2;                // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
constexpr uint32_t kAttributeProgrammaticSerialization = 6;  // ..._PROGRAMMATIC_STREAM_SERIALIZATION

// The driver entry points a native launch uses, from the libcuda.so.1 the process has loaded
// (torch's CUDA build loads it); never loaded from here, so a CPU-only machine needs none.
struct Driver {
  int (*launch)(const LaunchConfig*, void* function, void** params, void** extra) = nullptr;
  int (*current_context)(void** context) = nullptr;
  int (*error_string)(int error, const char** text) = nullptr;
};

// The driver, or null while libcuda.so.1 is not loaded (asked again next time). Under the GIL.
const Driver* cuda_driver() {
  static Driver driver;
  if (driver.launch == nullptr) {
    void* library = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) {
      return nullptr;
    }
    Driver found;
    found.launch = reinterpret_cast<decltype(found.launch)>(dlsym(library, "cuLaunchKernelEx"));
    found.current_context = reinterpret_cast<decltype(found.current_context)>(dlsym(library, "cuCtxGetCurrent"));
    found.error_string = reinterpret_cast<decltype(found.error_string)>(dlsym(library, "cuGetErrorString"));
    if (found.launch == nullptr || found.current_context == nullptr || found.error_string == nullptr) {
      return nullptr;
    }
    driver = found;
  }
  return &driver;
}

// One kernel parameter of a native launch (attnkit.prepared.NativeLaunch.params).
struct NativeParam {
  enum class Kind { kTensor, kI32, kI64, kU64, kF32, kPtr };
  Kind kind = Kind::kPtr;
  int slot = 0;          // kTensor: the program's tensor
  bool aligned = false;  // kTensor: whether its address must be 16-byte aligned (else must not be)
  uint64_t bits = 0;     // the value as the kernel reads it
};

struct NativeLaunch {
  PyObject* ready = nullptr;  // owned
  uint64_t function = 0;      // CUfunction
  std::array<unsigned, 3> grid{};
  unsigned block = 0;
  unsigned shared = 0;
  bool pdl = false;
  bool cooperative = false;
  std::vector<NativeParam> params;
};

// A layout's native forward (attnkit.prepared.NativeProgram), kept by q, k, v strides.
struct NativeProgram {
  std::array<int64_t, 12> strides{};
  int device = 0;
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> allocations;
  std::vector<NativeLaunch> launches;
  int result = 0;
  NativeProgram() = default;
  NativeProgram(const NativeProgram&) = delete;
  NativeProgram& operator=(const NativeProgram&) = delete;
  ~NativeProgram() {
    for (NativeLaunch& launch : launches) {
      Py_XDECREF(launch.ready);  // programs are dropped under the GIL (entries, calls)
    }
  }
};
using Programs = std::vector<std::shared_ptr<NativeProgram>>;

struct Entry {
  PyObject* problem = nullptr;  // owned references
  PyObject* run = nullptr;            // the PreparedRun's run
  PyObject* native_source = nullptr;  // its native_forward, or null
  std::optional<PlainCall> plain;
  Programs programs;
};

// Never destroyed: at exit their Python references must not be dropped after the interpreter is.
std::unordered_map<Key, Entry, KeyHash>& g_entries = *new std::unordered_map<Key, Entry, KeyHash>();
// Backend id -> name, for the names entries were made with.
std::vector<std::string>& g_backends = *new std::vector<std::string>();

// Drops an entry's references, once it has left the table: a run's destructor may call attention.
void release(Entry& entry) {
  entry.programs.clear();
  Py_XDECREF(entry.problem);
  Py_XDECREF(entry.run);
  Py_XDECREF(entry.native_source);
}

void clear_entries() {
  std::vector<Entry> owned;
  owned.reserve(g_entries.size());
  for (auto& item : g_entries) {
    owned.push_back(std::move(item.second));
  }
  g_entries.clear();
  g_backends.clear();
  for (Entry& entry : owned) {
    release(entry);
  }
}

// The backend's id, or -1 if no entry has it (and `add` is false).
int64_t backend_id(PyObject* backend, bool add) {
  Py_ssize_t length = 0;
  const char* text = PyUnicode_AsUTF8AndSize(backend, &length);
  if (text == nullptr) {
    PyErr_Clear();
    return -1;
  }
  std::string_view name(text, static_cast<size_t>(length));
  for (size_t i = 0; i < g_backends.size(); ++i) {
    if (g_backends[i] == name) {
      return static_cast<int64_t>(i);
    }
  }
  if (!add) {
    return -1;
  }
  g_backends.emplace_back(name);
  return static_cast<int64_t>(g_backends.size() - 1);
}

// An exact 4-D strided tensor with concrete sizes, or null.
const at::Tensor* plain_tensor(PyObject* obj) {
  if (!THPVariable_CheckExact(obj)) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.is_nested() || t.layout() != at::kStrided ||
      t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || t.dim() != 4) {
    return nullptr;
  }
  return &t;
}

// api.attention's memo key of (q, k, v, causal, scale, window, backend), or false where it keeps
// none: the same conditions, and none under a __torch_function__ mode (Python reads the shapes
// through it). `add_backend`: give a new backend name an id (only when an entry is made).
bool make_key(PyObject* const* args, Key& key, bool add_backend) {
  if (at::impl::torch_function_mode_enabled()) {
    return false;
  }
  int w = 0;
  const at::Tensor* tensors[3];
  for (int i = 0; i < 3; ++i) {
    tensors[i] = plain_tensor(args[i]);
    if (tensors[i] == nullptr) {
      return false;
    }
    for (int64_t size : tensors[i]->sizes()) {
      key[w++] = size;
    }
  }
  for (const at::Tensor* t : tensors) {
    key[w++] = static_cast<int64_t>(t->scalar_type());
  }
  for (const at::Tensor* t : tensors) {
    const c10::Device device = t->device();
    key[w++] = (static_cast<int64_t>(device.type()) << 16) | (static_cast<int64_t>(device.index()) & 0xffff);
  }
  PyObject* causal = args[3];
  if (causal != Py_True && causal != Py_False) {
    return false;
  }
  key[w++] = causal == Py_True;
  PyObject* scale = args[4];
  if (scale == Py_None) {
    key[w++] = 0;
    key[w++] = 0;
  } else {
    // |scale| > 1 is checked against the data (overflowing scores), so never kept; NaN fails too.
    if (!PyFloat_CheckExact(scale)) {
      return false;
    }
    double value = PyFloat_AS_DOUBLE(scale);
    if (!(std::fabs(value) <= 1.0)) {
      return false;
    }
    if (value == 0.0) {
      value = 0.0;  // -0.0 and 0.0 are one key, as in a Python dict
    }
    int64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    key[w++] = 1;
    key[w++] = bits;
  }
  PyObject* window = args[5];
  if (window == Py_None) {
    key[w++] = 0;
    key[w++] = 0;
    key[w++] = 0;
  } else {
    // Exactly a pair of exact ints: (True, 1) equals (1, 1) as a Python key, and is not kept.
    if (!PyTuple_CheckExact(window) || PyTuple_GET_SIZE(window) != 2) {
      return false;
    }
    key[w++] = 1;
    for (Py_ssize_t side = 0; side < 2; ++side) {
      PyObject* item = PyTuple_GET_ITEM(window, side);
      if (!PyLong_CheckExact(item)) {
        return false;
      }
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      key[w++] = value;
    }
  }
  PyObject* backend = args[6];
  if (!PyUnicode_CheckExact(backend)) {
    return false;
  }
  const int64_t id = backend_id(backend, add_backend);
  if (id < 0) {
    return false;
  }
  key[w++] = id;
  return w == kKeyWords;
}

// attnkit.sdpa.layout's rule, the case where it passes the operand as it is: a 16-byte aligned
// data pointer, rows a whole number of 16-byte steps, every stride (size-1 dimensions' too) a
// multiple of 16 bytes and none zero, the last one 1. Anything else is the Python run's.
bool layout_passes(const at::Tensor& t, int64_t item, int64_t last_dim) {
  if (!t.has_storage()) {
    return false;
  }
  if (reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0 || (last_dim * item) % 16 != 0) {
    return false;
  }
  const auto strides = t.strides();
  const int64_t batch = strides[0], heads = strides[1], rows = strides[2];
  return strides[3] == 1 && batch != 0 && heads != 0 && rows != 0 && ((batch | heads | rows) * item) % 16 == 0;
}

// Sets SDPA's enable-flags to exactly one choice and puts each back as it was on the way out.
class ForcedKernels {
 public:
  explicit ForcedKernels(const std::array<bool, 5>& on) {
    at::Context& ctx = at::globalContext();
    was_ = {ctx.userEnabledFlashSDP(), ctx.userEnabledMemEfficientSDP(), ctx.userEnabledMathSDP(),
            ctx.userEnabledCuDNNSDP(), ctx.userEnabledOverrideableSDP()};
    set(on);
  }
  ~ForcedKernels() { set(was_); }
  ForcedKernels(const ForcedKernels&) = delete;
  ForcedKernels& operator=(const ForcedKernels&) = delete;

 private:
  static void set(const std::array<bool, 5>& on) {
    at::Context& ctx = at::globalContext();
    ctx.setSDPUseFlash(on[0]);
    ctx.setSDPUseMemEfficient(on[1]);
    ctx.setSDPUseMath(on[2]);
    ctx.setSDPUseCuDNN(on[3]);
    ctx.setSDPUseOverrideable(on[4]);
  }
  std::array<bool, 5> was_{};
};

// Holds the warnings of a call until it is known to have run: a kernel that declines warns its
// reasons and raises, and then the Python run makes the call again and puts them in its error.
class HeldWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { held_.push_back(warning); }
  void release() {
    for (const c10::Warning& warning : held_) {
      c10::warn(warning);
    }
  }

 private:
  std::vector<c10::Warning> held_;
};

// The plain call on q, k, v, or nullopt if SDPA raised (the Python run then says why).
std::optional<at::Tensor> plain_sdpa(const PlainCall& call, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) {
  std::optional<ForcedKernels> forced;
  if (call.forced) {
    forced.emplace(call.kernels);
  }
  std::optional<at::Tensor> out;
  HeldWarnings held;
  PyThreadState* state = PyEval_SaveThread();  // as torch's own bindings do around an op
  {
    c10::WarningUtils::WarningHandlerGuard guard(&held);  // per thread
    try {
      out = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, call.is_causal, call.scale,
                                             call.enable_gqa);
    } catch (const std::exception&) {
      out.reset();
    }
  }
  PyEval_RestoreThread(state);
  if (out.has_value()) {
    held.release();  // to the handler that turns them into Python warnings (HANDLE_TH_ERRORS)
  }
  return out;
}

PyObject* call_run(PyObject* run, PyObject* const* args, PyObject* problem) {
  PyObject* run_args[4] = {args[0], args[1], args[2], problem};
  return PyObject_Vectorcall(run, run_args, 4, nullptr);
}

using Strides = std::array<int64_t, 12>;

Strides strides_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  Strides strides{};
  int w = 0;
  for (const at::Tensor* t : {&q, &k, &v}) {
    for (int64_t stride : t->strides()) {
      strides[w++] = stride;
    }
  }
  return strides;
}

// Whether the Python run would record a backward (attnkit.flash_autograd.flash_attention).
bool needs_grad(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

std::shared_ptr<NativeProgram> find_program(const Programs& programs, const Strides& strides) {
  for (const auto& program : programs) {
    if (program->strides == strides) {
      return program;
    }
  }
  return nullptr;
}

// Most parameters a native launch passes (attnkit's kernels pass 27 at most).
constexpr size_t kMaxParams = 64;

bool fail(const char* what) {
  PyErr_Format(PyExc_TypeError, "native program: %s", what);
  return false;
}

bool read_int(PyObject* obj, long long& value) {
  value = PyLong_AsLongLong(obj);
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "native program: expected a 64-bit int, got %s", Py_TYPE(obj)->tp_name);
    return false;
  }
  return true;
}

bool parse_launch(PyObject* spec, int slots, NativeLaunch& launch) {
  // NativeLaunch(ready, function, grid, block, shared, pdl, cooperative, params)
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 8) {
    return fail("a launch is (ready, function, grid, block, shared, pdl, cooperative, params)");
  }
  PyObject* ready = PyTuple_GET_ITEM(spec, 0);
  if (!PyCallable_Check(ready)) {
    return fail("ready must be callable");
  }
  long long function = 0, block = 0, shared = 0;
  if (!read_int(PyTuple_GET_ITEM(spec, 1), function) || !read_int(PyTuple_GET_ITEM(spec, 3), block) ||
      !read_int(PyTuple_GET_ITEM(spec, 4), shared)) {
    return false;
  }
  PyObject* grid = PyTuple_GET_ITEM(spec, 2);
  if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3) {
    return fail("grid must be 3 ints");
  }
  for (Py_ssize_t axis = 0; axis < 3; ++axis) {
    long long extent = 0;
    if (!read_int(PyTuple_GET_ITEM(grid, axis), extent)) {
      return false;
    }
    if (extent < 0 || extent > UINT32_MAX) {
      return fail("a grid extent is out of range");
    }
    launch.grid[axis] = static_cast<unsigned>(extent);
  }
  if (function == 0 || block <= 0 || block > 1024 || shared < 0 || shared > UINT32_MAX) {
    return fail("function, block or shared out of range");
  }
  PyObject* params = PyTuple_GET_ITEM(spec, 7);
  if (!PyTuple_Check(params) || static_cast<size_t>(PyTuple_GET_SIZE(params)) > kMaxParams) {
    return fail("params must be a tuple of at most 64 parameters");
  }
  launch.function = static_cast<uint64_t>(function);
  launch.block = static_cast<unsigned>(block);
  launch.shared = static_cast<unsigned>(shared);
  launch.pdl = PyTuple_GET_ITEM(spec, 5) == Py_True;
  launch.cooperative = PyTuple_GET_ITEM(spec, 6) == Py_True;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params); ++i) {
    PyObject* param = PyTuple_GET_ITEM(params, i);
    if (!PyTuple_Check(param) || PyTuple_GET_SIZE(param) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(param, 0))) {
      return fail("a parameter is (kind, value, ...)");
    }
    const char* kind_text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(param, 0));
    if (kind_text == nullptr) {
      return false;
    }
    const std::string_view kind(kind_text);
    PyObject* value = PyTuple_GET_ITEM(param, 1);
    NativeParam parsed;
    long long number = 0;
    if (kind == "tensor") {
      if (PyTuple_GET_SIZE(param) != 3) {
        return fail("a tensor parameter is (\"tensor\", slot, aligned)");
      }
      if (!read_int(value, number)) {
        return false;
      }
      if (number < 0 || number >= slots) {
        return fail("a tensor parameter names no slot");
      }
      parsed.kind = NativeParam::Kind::kTensor;
      parsed.slot = static_cast<int>(number);
      parsed.aligned = PyTuple_GET_ITEM(param, 2) == Py_True;
    } else if (kind == "fp32") {
      const double real = PyFloat_AsDouble(value);
      if (real == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return fail("an fp32 parameter is not a float");
      }
      const float single = static_cast<float>(real);  // as triton 3.6's pack_fp32
      uint32_t bits = 0;
      std::memcpy(&bits, &single, sizeof bits);
      parsed.kind = NativeParam::Kind::kF32;
      parsed.bits = bits;
    } else if (kind == "u64" || kind == "ptr") {
      const unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(value);
      if (unsigned_value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        return fail("a u64 or ptr parameter is not an unsigned 64-bit int");
      }
      parsed.kind = kind == "ptr" ? NativeParam::Kind::kPtr : NativeParam::Kind::kU64;
      parsed.bits = unsigned_value;
    } else if (kind == "i32" || kind == "i64") {
      if (!read_int(value, number)) {
        return false;
      }
      if (kind == "i32") {
        if (number < INT32_MIN || number > INT32_MAX) {
          return fail("an i32 parameter is out of range");
        }
        const int32_t narrow = static_cast<int32_t>(number);
        uint32_t bits = 0;
        std::memcpy(&bits, &narrow, sizeof bits);
        parsed.kind = NativeParam::Kind::kI32;
        parsed.bits = bits;
      } else {
        parsed.kind = NativeParam::Kind::kI64;
        std::memcpy(&parsed.bits, &number, sizeof number);
      }
    } else {
      return fail("a parameter's kind is not tensor, i32, i64, u64, fp32 or ptr");
    }
    launch.params.push_back(parsed);
  }
  Py_INCREF(ready);
  launch.ready = ready;
  return true;
}

// The NativeProgram `spec` made for tensors of these strides; null with a TypeError if malformed.
std::shared_ptr<NativeProgram> parse_program(PyObject* spec, const Strides& strides) {
  // NativeProgram(device, allocations, launches, result)
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4) {
    fail("expected (device, allocations, launches, result)");
    return nullptr;
  }
  auto program = std::make_shared<NativeProgram>();
  program->strides = strides;
  long long device = 0, result = 0;
  if (!read_int(PyTuple_GET_ITEM(spec, 0), device) || !read_int(PyTuple_GET_ITEM(spec, 3), result)) {
    return nullptr;
  }
  program->device = static_cast<int>(device);
  PyObject* allocations = PyTuple_GET_ITEM(spec, 1);
  PyObject* launches = PyTuple_GET_ITEM(spec, 2);
  if (!PyTuple_Check(allocations) || !PyTuple_Check(launches)) {
    fail("allocations and launches must be tuples");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(allocations); ++i) {
    PyObject* allocation = PyTuple_GET_ITEM(allocations, i);
    if (!PyTuple_Check(allocation) || PyTuple_GET_SIZE(allocation) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(allocation, 0)) || !THPDtype_Check(PyTuple_GET_ITEM(allocation, 1))) {
      fail("an allocation is (sizes, dtype)");
      return nullptr;
    }
    PyObject* sizes = PyTuple_GET_ITEM(allocation, 0);
    std::vector<int64_t> shape;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(sizes); ++d) {
      long long size = 0;
      if (!read_int(PyTuple_GET_ITEM(sizes, d), size)) {
        return nullptr;
      }
      if (size < 0) {
        fail("a size is negative");
        return nullptr;
      }
      shape.push_back(size);
    }
    const auto dtype = reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(allocation, 1))->scalar_type;
    program->allocations.emplace_back(std::move(shape), dtype);
  }
  const int slots = 3 + static_cast<int>(program->allocations.size());
  if (result < 0 || result >= slots) {
    fail("result names no slot");
    return nullptr;
  }
  program->result = static_cast<int>(result);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); ++i) {
    program->launches.emplace_back();
    if (!parse_launch(PyTuple_GET_ITEM(launches, i), slots, program->launches.back())) {
      return nullptr;
    }
  }
  return program;
}

// The program run on q, k, v: its result (a new reference); null without an error when a check
// declines (the caller then runs the Python run); null with one when a launch failed.
PyObject* run_native(const NativeProgram& program, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v) {
  const Driver* driver = cuda_driver();
  if (driver == nullptr || !q.is_cuda() || q.device().index() != program.device ||
      !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    return nullptr;
  }
  const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* context = nullptr;
  if (cuda->getDevice().index() != program.device || driver->current_context(&context) != 0 ||
      context == nullptr) {
    return nullptr;  // another current device, or no context on this thread: Triton's launcher
  }
  for (const NativeLaunch& launch : program.launches) {
    PyObject* ready = PyObject_CallNoArgs(launch.ready);
    if (ready == nullptr) {
      return nullptr;
    }
    const bool go = ready == Py_True;
    Py_DECREF(ready);
    if (!go) {
      return nullptr;
    }
  }
  void* stream = cuda->getStreamNativeHandle(cuda->getStream(q.device()));
  std::vector<at::Tensor> tensors{q, k, v};
  tensors.reserve(3 + program.allocations.size());
  int error = 0;
  bool aligned_as_bound = true;
  std::exception_ptr raised;
  PyThreadState* state = PyEval_SaveThread();  // as Triton's launcher and torch's bindings do
  try {
    for (const auto& [sizes, dtype] : program.allocations) {
      tensors.push_back(at::empty(sizes, q.options().dtype(dtype)));
    }
    for (const NativeLaunch& launch : program.launches) {  // every check before any launch
      for (const NativeParam& param : launch.params) {
        if (param.kind == NativeParam::Kind::kTensor) {
          const auto address = reinterpret_cast<uintptr_t>(tensors[param.slot].const_data_ptr());
          aligned_as_bound = aligned_as_bound && (address % 16 == 0) == param.aligned;
        }
      }
    }
    for (const NativeLaunch& launch : program.launches) {
      if (!aligned_as_bound) {
        break;  // compiled for another alignment: Triton's launcher picks the kernel
      }
      if (static_cast<uint64_t>(launch.grid[0]) * launch.grid[1] * launch.grid[2] == 0) {
        continue;  // as Triton's launcher: an empty grid launches nothing
      }
      std::array<uint64_t, kMaxParams> values{};
      std::array<void*, kMaxParams> pointers{};
      for (size_t i = 0; i < launch.params.size(); ++i) {
        const NativeParam& param = launch.params[i];
        values[i] = param.kind == NativeParam::Kind::kTensor
                        ? reinterpret_cast<uintptr_t>(tensors[param.slot].const_data_ptr())
                        : param.bits;
        pointers[i] = &values[i];  // a 4-byte value is in the low bytes (little-endian, as Triton's)
      }
      LaunchAttribute attributes[2] = {};
      unsigned count = 0;
      if (launch.pdl) {
        attributes[count].id = kAttributeProgrammaticSerialization;
        attributes[count++].value.flag = 1;
      }
      if (launch.cooperative) {
        attributes[count].id = kAttributeCooperative;
        attributes[count++].value.flag = 1;
      }
      LaunchConfig config{};
      std::copy(launch.grid.begin(), launch.grid.end(), config.grid);
      config.block[0] = launch.block;
      config.block[1] = config.block[2] = 1;
      config.shared = launch.shared;
      config.stream = stream;
      config.attrs = attributes;
      config.num_attrs = count;
      error = driver->launch(&config, reinterpret_cast<void*>(launch.function), pointers.data(), nullptr);
      if (error != 0) {
        break;
      }
    }
  } catch (...) {
    raised = std::current_exception();
  }
  PyEval_RestoreThread(state);
  if (raised) {
    std::rethrow_exception(raised);  // to HANDLE_TH_ERRORS: a Python error (out of memory, ...)
  }
  if (error != 0) {
    const char* text = nullptr;
    driver->error_string(error, &text);
    PyErr_Format(PyExc_RuntimeError, "attnkit.fastpath: launching a Triton kernel failed: CUDA error %d (%s)",
                 error, text != nullptr ? text : "unknown");
    return nullptr;
  }
  if (!aligned_as_bound) {
    return nullptr;
  }
  return THPVariable_Wrap(std::move(tensors[program.result]));
}

// A new reference to obj.name, or null (no error) when it has none or it is None.
PyObject* optional_attribute(PyObject* obj, const char* name) {
  PyObject* value = PyObject_GetAttrString(obj, name);
  if (value == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
    }
    return nullptr;
  }
  if (value == Py_None) {
    Py_DECREF(value);
    return nullptr;
  }
  return value;
}

// Asks the entry's native source for q, k, v's layout and keeps the program it gives (if any)
// under `key`; false with a Python error if the source raised or gave a malformed program.
bool learn_program(const Key& key, PyObject* native_source, PyObject* const* args) {
  PyObject* spec = PyObject_Vectorcall(native_source, args, 3, nullptr);
  if (spec == nullptr) {
    return false;
  }
  std::shared_ptr<NativeProgram> program;
  if (spec != Py_None) {
    const at::Tensor& q = THPVariable_Unpack(args[0]);
    const at::Tensor& k = THPVariable_Unpack(args[1]);
    const at::Tensor& v = THPVariable_Unpack(args[2]);
    program = parse_program(spec, strides_of(q, k, v));
  }
  Py_DECREF(spec);
  if (PyErr_Occurred()) {
    return false;
  }
  const auto found = g_entries.find(key);
  if (program == nullptr || found == g_entries.end() || found->second.native_source != native_source) {
    return true;  // nothing to keep, or the entry was replaced meanwhile
  }
  Programs& programs = found->second.programs;
  for (auto& kept : programs) {
    if (kept->strides == program->strides) {
      std::swap(kept, program);  // the older one is dropped when `program` goes
      return true;
    }
  }
  if (programs.size() >= kProgramsPerEntry) {
    programs.erase(programs.begin());
  }
  programs.push_back(std::move(program));
  return true;
}

// call(q, k, v, causal, scale, window, backend): attention's result for a kept signature, or
// None where there is no entry (the Python memo then takes the call).
PyObject* fast_call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "call expects (q, k, v, causal, scale, window, backend)");
    return nullptr;
  }
  Key key;
  if (!make_key(args, key, false)) {
    Py_RETURN_NONE;
  }
  const auto found = g_entries.find(key);
  if (found == g_entries.end()) {
    Py_RETURN_NONE;
  }
  // Own the entry's objects for the call: a nested call may clear the table meanwhile.
  PyObject* problem = found->second.problem;
  PyObject* run = found->second.run;
  PyObject* native_source = found->second.native_source;
  Py_INCREF(problem);
  Py_INCREF(run);
  Py_XINCREF(native_source);
  PyObject* result = nullptr;
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const at::Tensor& k = THPVariable_Unpack(args[1]);
  const at::Tensor& v = THPVariable_Unpack(args[2]);
  const bool no_modes = !c10::impl::TorchDispatchModeTLS::any_modes_set();
  const std::optional<PlainCall>& plain = found->second.plain;
  if (plain.has_value() && no_modes) {
    const PlainCall call = *plain;
    bool as_they_are = true;
    if (call.layout) {
      as_they_are = layout_passes(q, call.item, call.head_dim) && layout_passes(k, call.item, call.head_dim) &&
                    layout_passes(v, call.item, call.value_dim);
    }
    if (as_they_are) {
      std::optional<at::Tensor> out = plain_sdpa(call, q, k, v);
      if (out.has_value()) {
        result = THPVariable_Wrap(std::move(*out));
      }
    }
  }
  const bool native = native_source != nullptr && no_modes && !needs_grad(q, k, v);
  if (native && result == nullptr) {
    const std::shared_ptr<NativeProgram> program = find_program(found->second.programs, strides_of(q, k, v));
    if (program != nullptr) {
      result = run_native(*program, q, k, v);
    }
  }
  if (result == nullptr && !PyErr_Occurred()) {
    result = call_run(run, args, problem);
    // A layout seen for the first time, or whose program declined: its launches are bound now.
    if (result != nullptr && native && !learn_program(key, native_source, args)) {
      Py_CLEAR(result);
    }
  }
  Py_XDECREF(native_source);
  Py_DECREF(problem);
  Py_DECREF(run);
  return result;
  END_HANDLE_TH_ERRORS
}

bool parse_plain(PyObject* spec, PlainCall& call) {
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
    PyErr_SetString(PyExc_TypeError, "plain_sdpa_call: expected (kernels, is_causal, scale, enable_gqa, layout)");
    return false;
  }
  PyObject* kernels = PyTuple_GET_ITEM(spec, 0);
  if (kernels != Py_None) {
    if (!PyTuple_Check(kernels) || PyTuple_GET_SIZE(kernels) != 5) {
      PyErr_SetString(PyExc_TypeError, "plain_sdpa_call kernels: expected None or 5 bools");
      return false;
    }
    call.forced = true;
    for (Py_ssize_t i = 0; i < 5; ++i) {
      call.kernels[i] = PyTuple_GET_ITEM(kernels, i) == Py_True;
    }
  }
  call.is_causal = PyTuple_GET_ITEM(spec, 1) == Py_True;
  PyObject* scale = PyTuple_GET_ITEM(spec, 2);
  if (scale != Py_None) {
    const double value = PyFloat_AsDouble(scale);
    if (value == -1.0 && PyErr_Occurred()) {
      return false;
    }
    call.scale = value;
  }
  call.enable_gqa = PyTuple_GET_ITEM(spec, 3) == Py_True;
  PyObject* layout = PyTuple_GET_ITEM(spec, 4);
  if (layout != Py_None) {
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 3) {
      PyErr_SetString(PyExc_TypeError, "plain_sdpa_call layout: expected None or (item, head_dim, value_dim)");
      return false;
    }
    call.layout = true;
    call.item = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 0));
    call.head_dim = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 1));
    call.value_dim = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 2));
    if (PyErr_Occurred()) {
      return false;
    }
  }
  return true;
}

// remember(q, k, v, causal, scale, window, backend, problem, prepared): keep the signature's
// validated problem and its attnkit.prepared.PreparedRun (after a call of it returned): the
// run, and what it describes of itself (`plain_sdpa_call`, `native_forward`); True if kept.
PyObject* remember(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError,
                    "remember expects (q, k, v, causal, scale, window, backend, problem, prepared)");
    return nullptr;
  }
  PyObject* prepared = args[8];
  PyObject* run = PyObject_GetAttrString(prepared, "run");  // a new reference
  if (run == nullptr) {
    return nullptr;  // not a PreparedRun: the AttributeError says so
  }
  std::optional<PlainCall> plain;
  PyObject* spec = optional_attribute(prepared, "plain_sdpa_call");
  if (spec != nullptr) {
    PlainCall call;
    const bool parsed = parse_plain(spec, call);
    Py_DECREF(spec);
    if (!parsed) {
      Py_DECREF(run);
      return nullptr;
    }
    plain = call;
  } else if (PyErr_Occurred()) {
    Py_DECREF(run);
    return nullptr;
  }
  PyObject* native_source = optional_attribute(prepared, "native_forward");  // a new reference, or null
  if (native_source == nullptr && PyErr_Occurred()) {
    Py_DECREF(run);
    return nullptr;
  }
  if (g_entries.size() >= kCapacity) {
    clear_entries();
  }
  Key key;
  if (!make_key(args, key, true)) {
    Py_DECREF(run);
    Py_XDECREF(native_source);
    Py_RETURN_FALSE;
  }
  Entry entry;
  entry.problem = args[7];
  entry.run = run;  // the reference taken above
  entry.native_source = native_source;
  entry.plain = plain;
  Py_INCREF(entry.problem);
  auto [slot, inserted] = g_entries.try_emplace(key, entry);
  if (!inserted) {
    Entry old = std::move(slot->second);
    slot->second = std::move(entry);
    release(old);
  }
  if (native_source != nullptr && !c10::impl::TorchDispatchModeTLS::any_modes_set() &&
      !needs_grad(THPVariable_Unpack(args[0]), THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2])) &&
      !learn_program(key, native_source, args)) {
    return nullptr;
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* forget(PyObject* /*self*/, PyObject* /*unused*/) {
  clear_entries();
  Py_RETURN_NONE;
}

PyObject* size(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyLong_FromSize_t(g_entries.size());
}

// layout_passes(t, item, last_dim): whether the layout test takes t as it is.
PyObject* py_layout_passes(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3 || !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "layout_passes expects (tensor, item, last_dim)");
    return nullptr;
  }
  const long long item = PyLong_AsLongLong(args[1]);
  const long long last_dim = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (t.dim() != 4) {
    PyErr_SetString(PyExc_ValueError, "layout_passes expects a 4-D tensor");
    return nullptr;
  }
  return PyBool_FromLong(layout_passes(t, item, last_dim));
  END_HANDLE_TH_ERRORS
}

// records_backward(q, k, v): whether a call with these operands records a backward (needs_grad).
PyObject* py_records_backward(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3 || !THPVariable_Check(args[0]) || !THPVariable_Check(args[1]) || !THPVariable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "records_backward expects (q, k, v)");
    return nullptr;
  }
  return PyBool_FromLong(
      needs_grad(THPVariable_Unpack(args[0]), THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2])));
  END_HANDLE_TH_ERRORS
}

PyMethodDef kMethods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_call)), METH_FASTCALL,
     "call(q, k, v, causal, scale, window, backend): the kept signature's result, or None."},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(remember)), METH_FASTCALL,
     "remember(q, k, v, causal, scale, window, backend, problem, prepared) -> bool."},
    {"forget", forget, METH_NOARGS, "Drop every entry."},
    {"size", size, METH_NOARGS, "Number of entries."},
    {"layout_passes", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_layout_passes)),
     METH_FASTCALL, "layout_passes(t, item, last_dim) -> bool: the layout test on one operand."},
    {"records_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_records_backward)),
     METH_FASTCALL, "records_backward(q, k, v) -> bool: whether a call records a backward."},
    {nullptr, nullptr, 0, nullptr}};

#define ATTNKIT_CONCAT_(a, b) a##b
#define ATTNKIT_CONCAT(a, b) ATTNKIT_CONCAT_(a, b)
#define ATTNKIT_STRING_(a) #a
#define ATTNKIT_STRING(a) ATTNKIT_STRING_(a)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, ATTNKIT_STRING(TORCH_EXTENSION_NAME),
                       "attnkit's compiled call memo (attnkit.fastpath).", -1, kMethods};

}  // namespace

PyMODINIT_FUNC ATTNKIT_CONCAT(PyInit_, TORCH_EXTENSION_NAME)() {
  PyObject* module = PyModule_Create(&kModule);
  if (module != nullptr && PyModule_AddIntConstant(module, "SPEC_FORMAT", kSpecFormat) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
