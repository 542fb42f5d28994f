#pragma once
// Every shipped policy and UpdateRule: the same as <skewadam/rules/rules.hpp>.
#include "rules/rules.hpp"
