// skewadam-plan: how much optimizer state a model needs, per tier and per
// policy, from its tensor inventory alone. Nothing is allocated for the model.
//
//   skewadam-plan [INPUT... | --preset NAME] [--json] [--rule REGEX=TIER ...] [--no-default-rules]
//
// Exit status: 0 on success, 1 when an input cannot be read or planned,
// 2 for a bad command line.

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/plan.hpp>
#include <skewadam/tiers/tier_assignment.hpp>
#include <skewadam/version.hpp>

#include <skewadam_tools/inventory.hpp>
#include <skewadam_tools/inventory_loader.hpp>
#include <skewadam_tools/model_presets.hpp>
#include <skewadam_tools/plan_report.hpp>

namespace {

constexpr int exit_input_error = 1;
constexpr int exit_usage_error = 2;

struct Options {
  std::vector<std::string> inputs;
  std::string preset;
  std::vector<std::string> rules;
  bool json = false;
  bool no_default_rules = false;
  bool list_presets = false;
};

int run(const Options& opt) {
  using namespace skewadam;
  if (opt.list_presets) {
    for (const tools::Preset& p : tools::presets) std::cout << p.name << "  " << p.description << "\n";
    return 0;
  }
  if (opt.inputs.empty() == opt.preset.empty()) {
    std::cerr << "skewadam-plan: give either input files or --preset NAME (see --help)\n";
    return exit_usage_error;
  }

  TierAssigner assigner;
  std::vector<TensorSpec> tensors;
  try {
    assigner = TierAssigner::from_strings(opt.rules, !opt.no_default_rules, "--rule");
    if (!opt.preset.empty()) tensors = tools::preset_inventory(opt.preset, "--preset");
  } catch (const std::invalid_argument& e) {
    std::cerr << "skewadam-plan: " << e.what() << "\n";
    return exit_usage_error;
  }

  tools::Inventory inventory;
  std::string model;
  if (opt.preset.empty()) {
    inventory = tools::load_inventory(opt.inputs);
    model = opt.inputs.front() + (opt.inputs.size() > 1 ? " (+" + std::to_string(opt.inputs.size() - 1) + " more)" : "");
  } else {
    inventory.tensors = std::move(tensors);
    model = opt.preset + " (preset)";
  }

  const Plan plan = make_plan(inventory.tensors, assigner);
  if (opt.json) {
    std::cout << tools::plan_json(plan).dump(2) << "\n";
    if (!inventory.skipped.empty())
      std::cerr << "skewadam-plan: left out " << inventory.skipped.size()
                << " integer or boolean buffer(s), e.g. '" << inventory.skipped.front().name << "' ("
                << inventory.skipped.front().dtype << ")\n";
  } else {
    std::cout << tools::plan_table(plan, model, inventory.skipped);
  }
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "skewadam-plan: cannot write the output\n";
    return exit_input_error;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "How much optimizer state a model needs under SkewAdam, its ablations and the usual baselines, "
      "per tier, from tensor names, shapes and dtypes alone (nothing is allocated; of a .safetensors "
      "file only the header is read)."};
  app.set_version_flag("--version", std::to_string(skewadam::version_major) + "." +
                                        std::to_string(skewadam::version_minor) + "." +
                                        std::to_string(skewadam::version_patch));
  app.add_option("inputs", opt.inputs,
                 "INVENTORY.json ({\"tensors\": [{\"name\", \"shape\", \"dtype\"}]}), MODEL.safetensors, "
                 "a sharded checkpoint's *.index.json, or a checkpoint folder; several inputs are one model");
  app.add_option("--preset", opt.preset, "a built-in model instead of inputs (see --list-presets)");
  app.add_flag("--json", opt.json, "print one JSON object (integers: counts and bytes) instead of the table");
  app.add_option("--rule", opt.rules,
                 "REGEX=TIER (TIER: backbone, experts or router); tensors whose name matches REGEX "
                 "(ECMAScript, searched anywhere in the name) go to TIER. Repeatable; the first match "
                 "wins; tried before the default rules")
      ->expected(1)
      ->allow_extra_args(false)  // one value per --rule, so inputs may follow
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--no-default-rules", opt.no_default_rules,
               "use only --rule rules; a tensor that matches none is an error. Defaults: 'experts' -> "
               "experts; 'router' or a name component 'gate' -> router; anything else -> backbone");
  app.add_flag("--list-presets", opt.list_presets, "list the built-in models and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : exit_usage_error;
  } catch (const std::exception& e) {
    std::cerr << "skewadam-plan: " << e.what() << "\n";
    return exit_usage_error;
  }

  try {
    return run(opt);
  } catch (const std::bad_alloc&) {
    std::cerr << "skewadam-plan: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "skewadam-plan: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "skewadam-plan: unexpected error\n";
  }
  return exit_input_error;
}
