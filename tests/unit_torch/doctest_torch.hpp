#pragma once
// doctest in the LibTorch adapter's tests: include this instead of
// <doctest/doctest.h>. A LibTorch built with glog (Debian's) includes glog's
// logging.h, whose CHECK, CHECK_EQ, ... macros take doctest's names: an
// assertion through them is not counted when it holds, and aborts the
// program with none of doctest's report (the expression's values, CAPTURE)
// when it does not. This header includes torch's headers first (glog's guard
// then keeps it from coming back), then doctest, and gives the names back to
// doctest.

#include <torch/torch.h>

#include <doctest/doctest.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#define CHECK(...) DOCTEST_CHECK(__VA_ARGS__)
#define CHECK_EQ(...) DOCTEST_CHECK_EQ(__VA_ARGS__)
#define CHECK_NE(...) DOCTEST_CHECK_NE(__VA_ARGS__)
#define CHECK_LT(...) DOCTEST_CHECK_LT(__VA_ARGS__)
#define CHECK_LE(...) DOCTEST_CHECK_LE(__VA_ARGS__)
#define CHECK_GT(...) DOCTEST_CHECK_GT(__VA_ARGS__)
#define CHECK_GE(...) DOCTEST_CHECK_GE(__VA_ARGS__)
