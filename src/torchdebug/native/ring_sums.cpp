/* The flight recorder's per-tensor host work in one native call: a module's output, or a whole group
 * of parameters or gradients, checked, described and reduced into the ring with no Python per tensor.
 *
 * A CPython extension module (built by torchdebug/native/build.py against the installed torch, whose
 * THPVariable_Unpack gives the at::Tensor behind a Python tensor without a Python call). It takes a
 * tensor only where the Python path would give the same bits by the same kernel: an instance of one
 * of the plain tensor classes bind() was given (never a subclass), strided, on the CPU, float32,
 * bfloat16 or float64, contiguous, not a negative view. Its sums are written by stats.c's
 * td_stats_many (its address given to bind(): the same kernel and threads as the ctypes path) at
 * the slot's row of the ring, its element count beside them (as a double, as the ring holds it); the
 * GIL is released during the pass, as ctypes releases it. Anything else is left to Python, with
 * nothing written.
 *
 * Describing a slot: its Python Slot's dtype (the name bind() was given for the tensor's dtype, set
 * where it is not that very object) and shape (a tuple of ints, set where it differs), as
 * monitor/_watch.py's _describe does.
 *
 *   bind(kernel_address, plain_classes, dtype_names, identity, width)
 *   output_sums(tensor, slot, index, sums_row, numel_row, seen) -> bool
 *       a module's one output: taken (described, reduced, written, and noted in seen, the watcher's
 *       id(tensor) -> (weakref, version, index, waiting) of the tensors reduced in the step; one
 *       noted there with its sums in the ring, unchanged since, is described and gets a copy of
 *       them) or not (nothing done): an empty tensor, or one seen whose sums are on their way
 *       (waiting is not None), is the Python path's.
 *   group_sums(tensors, slots, indices, sums_row, numel_row) -> bool
 *       every tensor of a list, or none: each described and reduced, in one kernel call; an empty
 *       one gets the sums of no elements (identity) and a count of 0.
 * sums_row, numel_row: the addresses of slot 0's sums and element count in the step's rows.
 */
#include <Python.h>

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using ManyKernel = int64_t (*)(int64_t count, const int64_t *entries, int threads);

constexpr int KERNEL_DTYPES = 3;

ManyKernel kernel = nullptr;
PyObject *plain_classes = nullptr;            // a tuple of the classes taken (exact, no subclass)
PyObject *dtype_names[KERNEL_DTYPES] = {};   // float32, bfloat16, float64: the Slot.dtype names
std::vector<double> identity;                // the sums of no elements, WIDTH doubles
PyObject *dtype_attribute = nullptr;
PyObject *shape_attribute = nullptr;

int dtype_code(c10::ScalarType type) {
    switch (type) {
    case c10::ScalarType::Float: return 0;
    case c10::ScalarType::BFloat16: return 1;
    case c10::ScalarType::Double: return 2;
    default: return -1;
    }
}

bool is_plain(PyObject *object) {
    PyTypeObject *type = Py_TYPE(object);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(plain_classes); i++) {
        if ((PyObject *)type == PyTuple_GET_ITEM(plain_classes, i)) return true;
    }
    return false;
}

/* The kernel's entry for `object` (data, dtype code, element count; the address is the caller's),
 * or false where the native path does not take it. */
bool taken(PyObject *object, int64_t entry[3]) {
    if (kernel == nullptr || !is_plain(object)) return false;
    const at::Tensor &tensor = THPVariable_Unpack(object);
    try {
        // an inference tensor keeps no version to tell a later read by: Python's path takes it
        if (!tensor.defined() || tensor.layout() != c10::kStrided || !tensor.is_cpu() || tensor.is_neg() || tensor.is_inference()) return false;
        int code = dtype_code(tensor.scalar_type());
        if (code < 0 || !tensor.is_contiguous() || !tensor.has_storage()) return false;
        entry[0] = (int64_t)(intptr_t)tensor.const_data_ptr();
        entry[1] = code;
        entry[2] = tensor.numel();
    } catch (const std::exception &) {  // a tensor without readable memory: Python's path decides
        return false;
    }
    return true;
}

/* Slot.dtype and Slot.shape as _describe sets them; -1 with a Python error set. */
int describe(PyObject *slot, PyObject *object, int code) {
    const at::Tensor &tensor = THPVariable_Unpack(object);
    PyObject *dtype = PyObject_GetAttr(slot, dtype_attribute);
    if (dtype == nullptr) return -1;
    Py_DECREF(dtype);  // the slot still holds it: only its identity is compared
    if (dtype != dtype_names[code] && PyObject_SetAttr(slot, dtype_attribute, dtype_names[code]) < 0) return -1;
    c10::IntArrayRef sizes = tensor.sizes();
    PyObject *shape = PyObject_GetAttr(slot, shape_attribute);
    if (shape == nullptr) return -1;
    bool same = PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == (Py_ssize_t)sizes.size();
    for (size_t d = 0; same && d < sizes.size(); d++) {
        PyObject *item = PyTuple_GET_ITEM(shape, d);
        int overflow = 0;
        same = PyLong_Check(item) && PyLong_AsLongLongAndOverflow(item, &overflow) == sizes[d] && !overflow;
    }
    Py_DECREF(shape);
    if (same) return 0;
    PyObject *fresh = PyTuple_New((Py_ssize_t)sizes.size());
    if (fresh == nullptr) return -1;
    for (size_t d = 0; d < sizes.size(); d++) {
        PyObject *size = PyLong_FromLongLong(sizes[d]);
        if (size == nullptr) {
            Py_DECREF(fresh);
            return -1;
        }
        PyTuple_SET_ITEM(fresh, d, size);
    }
    int result = PyObject_SetAttr(slot, shape_attribute, fresh);
    Py_DECREF(fresh);
    return result;
}

void run_kernel(const std::vector<int64_t> &entries) {
    if (entries.empty()) return;
    int threads = at::get_num_threads();
    Py_BEGIN_ALLOW_THREADS
    kernel((int64_t)(entries.size() / 4), entries.data(), threads);
    Py_END_ALLOW_THREADS
}

bool int64_arguments(PyObject *const *args, Py_ssize_t first, Py_ssize_t count, int64_t *values) {
    for (Py_ssize_t i = 0; i < count; i++) {
        values[i] = PyLong_AsLongLong(args[first + i]);
        if (values[i] == -1 && PyErr_Occurred()) return false;
    }
    return true;
}

PyObject *bind(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != KERNEL_DTYPES ||
        !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "bind(kernel_address, plain_classes, dtype_names, identity, width)");
        return nullptr;
    }
    int64_t address = PyLong_AsLongLong(args[0]);
    int64_t width = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return nullptr;
    if (PyTuple_GET_SIZE(args[3]) != width) {
        PyErr_SetString(PyExc_ValueError, "bind: identity must hold width sums");
        return nullptr;
    }
    identity.assign((size_t)width, 0.0);
    for (int64_t i = 0; i < width; i++) {
        identity[(size_t)i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[3], i));
        if (PyErr_Occurred()) return nullptr;
    }
    Py_INCREF(args[1]);
    Py_XSETREF(plain_classes, args[1]);
    for (int i = 0; i < KERNEL_DTYPES; i++) {
        Py_INCREF(PyTuple_GET_ITEM(args[2], i));
        Py_XSETREF(dtype_names[i], PyTuple_GET_ITEM(args[2], i));
    }
    kernel = (ManyKernel)(intptr_t)address;
    Py_RETURN_NONE;
}

/* Whether seen[key] records `object` at `version` (reduced before in the step, unchanged since). */
bool seen_unchanged(PyObject *record, PyObject *object, int64_t version) {
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 2 || !PyWeakref_Check(PyTuple_GET_ITEM(record, 0))) return false;
    if (PyWeakref_GetObject(PyTuple_GET_ITEM(record, 0)) != object) return false;
    PyObject *seen_version = PyTuple_GET_ITEM(record, 1);
    return PyLong_Check(seen_version) && PyLong_AsLongLong(seen_version) == version;
}

PyObject *output_sums(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "output_sums(tensor, slot, index, sums_row, numel_row, seen: dict)");
        return nullptr;
    }
    int64_t entry[3], where[3];
    if (!int64_arguments(args, 2, 3, where)) return nullptr;
    if (!taken(args[0], entry) || entry[2] == 0) Py_RETURN_FALSE;
    const int64_t version = (int64_t)THPVariable_Unpack(args[0])._version();
    PyObject *key = PyLong_FromVoidPtr(args[0]);  // id(tensor)
    if (key == nullptr) return nullptr;
    PyObject *record = PyDict_GetItemWithError(args[5], key);
    if (record == nullptr && PyErr_Occurred()) {
        Py_DECREF(key);
        return nullptr;
    }
    const int64_t index = where[0];
    const int64_t width = (int64_t)identity.size();
    if (record != nullptr && seen_unchanged(record, args[0], version)) {  // reduced before: a copy of its sums
        Py_DECREF(key);
        PyObject *first = PyTuple_GET_SIZE(record) == 4 ? PyTuple_GET_ITEM(record, 2) : nullptr;
        if (first == nullptr || !PyLong_Check(first) || PyTuple_GET_ITEM(record, 3) != Py_None) Py_RETURN_FALSE;
        const int64_t source = PyLong_AsLongLong(first);
        if (describe(args[1], args[0], (int)entry[1]) < 0) return nullptr;
        const double *sums = (const double *)(intptr_t)where[1];
        std::copy(sums + source * width, sums + (source + 1) * width, (double *)(intptr_t)where[1] + index * width);
        ((double *)(intptr_t)where[2])[index] = ((const double *)(intptr_t)where[2])[source];
        Py_RETURN_TRUE;
    }
    PyObject *reference = PyWeakref_NewRef(args[0], nullptr);
    record = reference == nullptr ? nullptr : Py_BuildValue("(NLLO)", reference, (long long)version, (long long)index, Py_None);
    if (record == nullptr || describe(args[1], args[0], (int)entry[1]) < 0 || PyDict_SetItem(args[5], key, record) < 0) {
        Py_DECREF(key);
        Py_XDECREF(record);
        return nullptr;
    }
    Py_DECREF(key);
    Py_DECREF(record);
    double *sums = (double *)(intptr_t)where[1] + index * width;
    ((double *)(intptr_t)where[2])[index] = (double)entry[2];
    run_kernel({entry[0], entry[1], entry[2], (int64_t)(intptr_t)sums});
    Py_RETURN_TRUE;
}

PyObject *group_sums(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "group_sums(tensors: list, slots: list, indices: list, sums_row, numel_row)");
        return nullptr;
    }
    const Py_ssize_t count = PyList_GET_SIZE(args[0]);
    if (PyList_GET_SIZE(args[1]) != count || PyList_GET_SIZE(args[2]) != count) {
        PyErr_SetString(PyExc_ValueError, "group_sums: tensors, slots and indices differ in length");
        return nullptr;
    }
    int64_t rows[2];
    if (!int64_arguments(args, 3, 2, rows)) return nullptr;
    std::vector<int64_t> found((size_t)count * 3);
    for (Py_ssize_t i = 0; i < count; i++) {  // every tensor first: all of them or none
        if (!taken(PyList_GET_ITEM(args[0], i), &found[(size_t)i * 3])) Py_RETURN_FALSE;
    }
    const int64_t width = (int64_t)identity.size();
    std::vector<int64_t> entries;
    entries.reserve((size_t)count * 4);
    for (Py_ssize_t i = 0; i < count; i++) {
        const int64_t *entry = &found[(size_t)i * 3];
        if (describe(PyList_GET_ITEM(args[1], i), PyList_GET_ITEM(args[0], i), (int)entry[1]) < 0) return nullptr;
        const int64_t index = PyLong_AsLongLong(PyList_GET_ITEM(args[2], i));
        if (index == -1 && PyErr_Occurred()) return nullptr;
        double *sums = (double *)(intptr_t)rows[0] + index * width;
        ((double *)(intptr_t)rows[1])[index] = (double)entry[2];
        if (entry[2] == 0) {
            std::copy(identity.begin(), identity.end(), sums);
        } else {
            entries.insert(entries.end(), {entry[0], entry[1], entry[2], (int64_t)(intptr_t)sums});
        }
    }
    run_kernel(entries);
    Py_RETURN_TRUE;
}

PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(kernel_address, plain_classes, dtype_names, identity, width)"},
    {"output_sums", (PyCFunction)(void (*)(void))output_sums, METH_FASTCALL, "A module's one output into the ring, or False."},
    {"group_sums", (PyCFunction)(void (*)(void))group_sums, METH_FASTCALL, "A list of tensors into the ring, all or none."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "ring_sums", "The flight recorder's per-tensor work, native.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_ring_sums(void) {
    dtype_attribute = PyUnicode_InternFromString("dtype");
    shape_attribute = PyUnicode_InternFromString("shape");
    if (dtype_attribute == nullptr || shape_attribute == nullptr) return nullptr;
    return PyModule_Create(&module);
}
