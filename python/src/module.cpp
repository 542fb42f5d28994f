// The Python module skewadam._skewadam: the engines of every variant and what
// the Python half needs to know about this build. One translation unit: the
// variants share their methods (EngineBase, engine.hpp), so the torch headers
// are parsed once and the adapter compiled once.

#include "engine.hpp"

#include <string>

#include <skewadam/checkpoint/format.hpp>
#include <skewadam/engine/nonfinite.hpp>
#include <skewadam/tiers/variants.hpp>
#include <skewadam/version.hpp>

namespace skewadam::python {

void bind_engine_base(py::module_& m) {
  using E = EngineBase;
  py::class_<E>(m, "Engine")
      .def("step", &E::step, py::arg("hyper"))
      .def("step_parameter", &E::step_parameter, py::arg("name"), py::arg("hyper"))
      .def("step_open", &E::step_open)
      .def("end_open_step", &E::end_open_step)
      .def("check_step_inside_backward", &E::check_step_inside_backward)
      .def("last_step", &E::last_step)
      .def("names", &E::names)
      .def("tier", &E::tier, py::arg("name"))
      .def("steps", &E::steps)
      .def("seed", &E::seed)
      .def("device", &E::device)
      .def("state_bytes", &E::state_bytes)
      .def("tier_state_bytes", &E::tier_state_bytes, py::arg("tier"))
      .def("rules", &E::rules)
      .def("param_state", &E::param_state, py::arg("name"))
      .def("momentum", &E::momentum, py::arg("name"))
      .def("export_state", &E::export_state)
      .def("import_state", &E::import_state, py::arg("steps"), py::arg("seed"), py::arg("hyper"), py::arg("params"),
           py::arg("previous_grad_norm"))
      .def("save_checkpoint", &E::save_checkpoint, py::arg("path"), py::arg("hyper"), py::arg("include_params"))
      .def("load_checkpoint", &E::load_checkpoint, py::arg("path"))
      .def("hyperparameters", &E::hyperparameters);
}

/// The engine of every variant the library names (skewadam::Variants), as
/// the class <Name>Engine, and the list `variants` of (name, engine class,
/// what it is) from which the package makes its optimizer classes.
void bind_variants(py::module_& m) {
  py::list variants;
  Variants::for_each([&]<class Tiers>() {
    static const std::string engine = std::string(Variant<Tiers>::name) + "Engine";
    bind_engine<Tiers>(m, engine.c_str());
    variants.append(py::make_tuple(std::string(Variant<Tiers>::name), m.attr(engine.c_str()),
                                   std::string(Variant<Tiers>::doc)));
  });
  m.attr("variants") = variants;
}

}  // namespace skewadam::python

PYBIND11_MODULE(_skewadam, m) {
  m.doc() = "skewadam's compiled engines (use the classes of the skewadam package)";
  // (before the variants, whose classes derive from it)
  skewadam::python::bind_engine_base(m);
  skewadam::python::bind_variants(m);
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
