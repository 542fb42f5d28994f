// The Python module skewadam._skewadam: the engines of every variant (bound
// in two translation units, so that they compile side by side) and what the
// Python half needs to know about this build.

#include <torch/extension.h>

#include <string>

#include <skewadam/checkpoint/format.hpp>
#include <skewadam/nonfinite.hpp>
#include <skewadam/version.hpp>

namespace skewadam::python {
void bind_paper_variants(pybind11::module_& m);
void bind_baselines(pybind11::module_& m);
}  // namespace skewadam::python

PYBIND11_MODULE(_skewadam, m) {
  m.doc() = "skewadam's compiled engines (use the classes of the skewadam package)";
  skewadam::python::bind_paper_variants(m);
  skewadam::python::bind_baselines(m);
  pybind11::register_exception<skewadam::NonFiniteGradientError>(m, "NonFiniteGradientError", PyExc_RuntimeError);
  // A checkpoint file that cannot be read, or does not match the optimizer.
  pybind11::register_exception<skewadam::CheckpointError>(m, "CheckpointError", PyExc_ValueError);
  m.attr("version") = std::to_string(skewadam::version_major) + "." + std::to_string(skewadam::version_minor) + "." +
                      std::to_string(skewadam::version_patch);
#if defined(SKEWADAM_PYTHON_WITH_CUDA)
  m.attr("cuda") = true;
#else
  m.attr("cuda") = false;
#endif
}
