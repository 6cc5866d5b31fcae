// The Python module lltm_train._C (setup.py's build only): importing it loads this library, whose static
// registrations (TORCH_LIBRARY in lltm.cpp and the kernels) make torch.ops.lltm.*. The op library itself
// needs no Python: the JIT build and CMake (liblltm_ops.so) leave this file out.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
