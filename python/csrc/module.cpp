// dsv4attn._C: the module. dsv4::Error becomes the Python exception class registered by
// dsv4attn/__init__.py (dsv4attn.Error, a ValueError and RuntimeError subclass); before that
// registration (or if it never happens) it becomes ValueError. No C++ exception crosses into
// Python as a crash: anything else becomes RuntimeError through nanobind's default translators.
#include <nanobind/nanobind.h>

#include "dsv4/device_tensor.h"  // cuda_built
#include "dsv4/status.h"
#include "dsv4/version.h"

namespace nb = nanobind;

namespace dsv4::python {
void bind_ops(nb::module_& m);
void bind_cache(nb::module_& m);
void bind_layer(nb::module_& m);
void bind_compressor(nb::module_& m);
void bind_indexer(nb::module_& m);
void bind_sparse_mla(nb::module_& m);
}  // namespace dsv4::python

namespace {

// Owned reference to the Python class dsv4::Error maps to (set once from Python).
PyObject* g_error_type = nullptr;

void set_error_type(nb::handle cls) {
  if (!PyType_Check(cls.ptr()) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                        reinterpret_cast<PyTypeObject*>(PyExc_Exception)))
    throw nb::type_error("_set_error_type: expected an Exception subclass");
  Py_XDECREF(g_error_type);
  g_error_type = cls.inc_ref().ptr();
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "dsv4attn C++ ops (DeepSeek-V4 sparse attention) over DLPack tensors";
  m.attr("__version__") = dsv4::version();
  m.def("_set_error_type", &set_error_type, nb::arg("cls"));
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dsv4::Error& e) {
      PyErr_SetString(g_error_type ? g_error_type : PyExc_ValueError, e.what());
    }
  });
  m.attr("with_cuda") = dsv4::cuda_built();
  dsv4::python::bind_ops(m);
  dsv4::python::bind_cache(m);
  dsv4::python::bind_layer(m);
  dsv4::python::bind_compressor(m);
  dsv4::python::bind_indexer(m);
  dsv4::python::bind_sparse_mla(m);
}
