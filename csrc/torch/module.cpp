// Importing redrafter_ext._C loads the TORCH_LIBRARY registrations; the module itself is empty.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "redrafter_ext native ops", -1, nullptr};
  return PyModule_Create(&def);
}
