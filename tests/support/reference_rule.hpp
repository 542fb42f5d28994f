#pragma once
// A deliberately plain implementation of docs/spec.md §3 in double precision,
// written from the equations (three passes, full-size temporaries), used as
// an independent oracle for the library on random inputs.

#include <cmath>
#include <cstdint>
#include <vector>

namespace reference {

struct Settings {
  bool momentum = false;
  bool factored = false;
  bool adam = false;          ///< AdamW: eps added to sqrt(v), no clipping
  bool per_matrix = false;    ///< clip scope
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.0, clip = 1.0;
};

struct State {
  std::vector<double> m, v, row, col;
  std::int64_t t = 0;
};

/// One step on p (double) for a tensor seen as B matrices r x c.
inline void step(const Settings& s, State& st, std::vector<double>& p, const std::vector<double>& g, std::int64_t B,
                 std::int64_t r, std::int64_t c) {
  const std::int64_t n = B * r * c;
  const bool fact = s.factored;
  if (st.t == 0) {
    st.m.assign(n, 0.0);
    if (fact) {
      st.row.assign(B * r, 0.0);
      st.col.assign(B * c, 0.0);
    } else {
      st.v.assign(n, 0.0);
    }
  }
  st.t += 1;
  const double t = static_cast<double>(st.t);
  const double bc1 = 1 - std::pow(s.beta1, t), bc2 = 1 - std::pow(s.beta2, t);
  for (auto& x : p) x *= 1 - s.lr * s.wd;
  std::vector<double> d(n), u(n);
  if (fact) {
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < r; ++i) {
        double acc = 0;
        for (std::int64_t j = 0; j < c; ++j) acc += g[(b * r + i) * c + j] * g[(b * r + i) * c + j];
        st.row[b * r + i] = s.beta2 * st.row[b * r + i] + (1 - s.beta2) * acc / static_cast<double>(c);
      }
      for (std::int64_t j = 0; j < c; ++j) {
        double acc = 0;
        for (std::int64_t i = 0; i < r; ++i) acc += g[(b * r + i) * c + j] * g[(b * r + i) * c + j];
        st.col[b * c + j] = s.beta2 * st.col[b * c + j] + (1 - s.beta2) * acc / static_cast<double>(r);
      }
      double mean = 0;
      for (std::int64_t i = 0; i < r; ++i) mean += st.row[b * r + i];
      const double vbar = std::max(mean / static_cast<double>(r), 1e-15);
      for (std::int64_t i = 0; i < r; ++i)
        for (std::int64_t j = 0; j < c; ++j)
          d[(b * r + i) * c + j] =
              std::sqrt(std::max(st.row[b * r + i] / vbar, s.eps)) * std::sqrt(std::max(st.col[b * c + j], s.eps));
    }
  } else {
    for (std::int64_t k = 0; k < n; ++k) {
      st.v[k] = s.beta2 * st.v[k] + (1 - s.beta2) * g[k] * g[k];
      d[k] = s.adam ? std::sqrt(st.v[k]) + s.eps * std::sqrt(bc2) : std::sqrt(std::max(st.v[k], s.eps));
    }
  }
  for (std::int64_t k = 0; k < n; ++k) {
    if (s.momentum) {
      st.m[k] = s.beta1 * st.m[k] + (1 - s.beta1) * g[k];
      u[k] = st.m[k] * std::sqrt(bc2) / bc1;
    } else {
      u[k] = g[k] * std::sqrt(bc2);
    }
    u[k] /= d[k];
  }
  if (!s.adam) {
    const std::int64_t scopes = s.per_matrix ? B : 1;
    const std::int64_t size = n / scopes;
    for (std::int64_t q = 0; q < scopes; ++q) {
      double ss = 0;
      for (std::int64_t k = q * size; k < (q + 1) * size; ++k) ss += u[k] * u[k];
      const double div = std::max(std::sqrt(ss / static_cast<double>(size)) / s.clip, 1.0);
      for (std::int64_t k = q * size; k < (q + 1) * size; ++k) u[k] /= div;
    }
  }
  for (std::int64_t k = 0; k < n; ++k) p[k] -= s.lr * u[k];
}

}  // namespace reference
