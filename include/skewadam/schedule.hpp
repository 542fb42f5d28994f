#pragma once
// Kept where it was before the headers were grouped by layer: the same as
// <skewadam/math/schedule.hpp>.
#include "math/schedule.hpp"
