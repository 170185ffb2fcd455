// The memo of attnkit.attention's eager calls, compiled: the call signature's key, its lookup,
// and for a plain SDPA problem the fused-kernel layout test, the forced kernel's enable-flags
// and the SDPA call itself, with no Python in between. Built and loaded by attnkit.fast_calls;
// attnkit.api keeps its Python memo behind this one, for every call this one does not take.
//
// Why: on the H100 hosts a Python layer that validates a call before SDPA costs 7-12 us with
// gradients (the 13-part key and its lookup, three stride() and three data_ptr(); measured
// rung by rung in docs/evidence/h100-2026-11-24/session19). Here the same work is a few hundred
// nanoseconds of C++, and the Python left is attention()'s own frame.
//
// What this file decides is only what the Python memo decides, read from the same things:
//   * which calls have a key (api.attention's conditions, one for one: exact tensors here, so
//     that a Tensor subclass keeps its __torch_function__);
//   * which operands SDPA's fused kernels may read as they are (attnkit.sdpa's layout rule;
//     any operand the rule would copy is handed to the Python run, which copies it).
// Anything it does not take it hands back (None) or to the entry's Python run, never decides.

#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// The format of the spec tuple attnkit.sdpa gives a prepared run (`plain_sdpa_call`); the
// loader refuses a module whose format differs from the one it writes.
constexpr long kSpecFormat = 1;
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

// The SDPA call a plain problem's run makes (attnkit.sdpa.sdpa_prepare).
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

struct Entry {
  PyObject* problem = nullptr;  // owned references
  PyObject* run = nullptr;
  std::optional<PlainCall> plain;
};

std::unordered_map<Key, Entry, KeyHash> g_entries;
std::vector<std::string> g_backends;  // backend id -> name, for the names entries were made with

void clear_entries() {
  // Drop the references only after the table is empty: a run's destructor may call attention.
  std::vector<PyObject*> owned;
  owned.reserve(2 * g_entries.size());
  for (auto& item : g_entries) {
    owned.push_back(item.second.problem);
    owned.push_back(item.second.run);
  }
  g_entries.clear();
  g_backends.clear();
  for (PyObject* obj : owned) {
    Py_DECREF(obj);
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

// attnkit.sdpa's layout rule, the case where it passes the operand as it is: a 16-byte aligned
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
  Py_INCREF(problem);
  Py_INCREF(run);
  PyObject* result = nullptr;
  const std::optional<PlainCall>& plain = found->second.plain;
  if (plain.has_value() && !c10::impl::TorchDispatchModeTLS::any_modes_set()) {
    const PlainCall call = *plain;
    const at::Tensor& q = THPVariable_Unpack(args[0]);
    const at::Tensor& k = THPVariable_Unpack(args[1]);
    const at::Tensor& v = THPVariable_Unpack(args[2]);
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
  if (result == nullptr && !PyErr_Occurred()) {
    result = call_run(run, args, problem);
  }
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

// remember(q, k, v, causal, scale, window, backend, problem, run, plain_sdpa_call): keep the
// signature's validated problem and run (after a call of it returned); True if kept.
PyObject* remember(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError,
                    "remember expects (q, k, v, causal, scale, window, backend, problem, run, plain_sdpa_call)");
    return nullptr;
  }
  std::optional<PlainCall> plain;
  if (args[9] != Py_None) {
    PlainCall call;
    if (!parse_plain(args[9], call)) {
      return nullptr;
    }
    plain = call;
  }
  if (g_entries.size() >= kCapacity) {
    clear_entries();
  }
  Key key;
  if (!make_key(args, key, true)) {
    Py_RETURN_FALSE;
  }
  Entry entry;
  entry.problem = args[7];
  entry.run = args[8];
  entry.plain = plain;
  Py_INCREF(entry.problem);
  Py_INCREF(entry.run);
  auto [slot, inserted] = g_entries.try_emplace(key, entry);
  if (!inserted) {
    PyObject* old_problem = slot->second.problem;
    PyObject* old_run = slot->second.run;
    slot->second = entry;
    Py_DECREF(old_problem);
    Py_DECREF(old_run);
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

PyMethodDef kMethods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_call)), METH_FASTCALL,
     "call(q, k, v, causal, scale, window, backend): the kept signature's result, or None."},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(remember)), METH_FASTCALL,
     "remember(q, k, v, causal, scale, window, backend, problem, run, plain_sdpa_call) -> bool."},
    {"forget", forget, METH_NOARGS, "Drop every entry."},
    {"size", size, METH_NOARGS, "Number of entries."},
    {"layout_passes", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_layout_passes)),
     METH_FASTCALL, "layout_passes(t, item, last_dim) -> bool: the layout test on one operand."},
    {nullptr, nullptr, 0, nullptr}};

#define ATTNKIT_CONCAT_(a, b) a##b
#define ATTNKIT_CONCAT(a, b) ATTNKIT_CONCAT_(a, b)
#define ATTNKIT_STRING_(a) #a
#define ATTNKIT_STRING(a) ATTNKIT_STRING_(a)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, ATTNKIT_STRING(TORCH_EXTENSION_NAME),
                       "attnkit's compiled call memo (attnkit.fast_calls).", -1, kMethods};

}  // namespace

PyMODINIT_FUNC ATTNKIT_CONCAT(PyInit_, TORCH_EXTENSION_NAME)() {
  PyObject* module = PyModule_Create(&kModule);
  if (module != nullptr && PyModule_AddIntConstant(module, "SPEC_FORMAT", kSpecFormat) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
