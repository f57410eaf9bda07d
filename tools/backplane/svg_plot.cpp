#include "svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace backplane::cli {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) { return format_number(v); }

// About five round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  const double span = hi - lo;
  const double raw = span / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(t);
  return out;
}

struct Tick {
  double value;
  bool labelled;
};

// Ticks of a log axis over [10^lo, 10^hi]: every m * 10^d (m = 1..9) as a grid
// line; labels on 1, 2 and 5 when the axis spans at most two decades, else on
// the powers of ten only.
std::vector<Tick> log_ticks(double lo, double hi) {
  const bool dense = hi - lo <= 2.0;
  std::vector<Tick> out;
  for (int d = static_cast<int>(std::floor(lo)); d <= static_cast<int>(std::ceil(hi)); ++d)
    for (int m = 1; m <= 9; ++m) {
      const double v = m * std::pow(10.0, d);
      const double l = std::log10(v);
      if (l < lo - 1e-12 || l > hi + 1e-12) continue;
      out.push_back({v, m == 1 || (dense && (m == 2 || m == 5))});
    }
  return out;
}

}  // namespace

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string svg_line_chart(const ChartOptions& options, const std::vector<Series>& series) {
  constexpr double W = 760, H = 440, L = 70, R = 20, T = 40, B = 55;
  const bool log_y = options.log_y;
  // A point is drawn when finite (and positive on a log axis).
  const auto drawn = [log_y](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0);
  };
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : series)
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!drawn(s.x[i], s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      const double y = log_y ? std::log10(s.y[i]) : s.y[i];
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  x0 = std::min(x0, 0.0);  // epochs: the axis starts where training does
  if (x1 == x0) x1 = x0 + 1;
  if (log_y) {
    if (y1 - y0 < 0.3) y0 -= 0.15, y1 += 0.15;  // at least half a decade
    const double pad = (y1 - y0) * 0.04;
    y0 -= pad, y1 += pad;
  } else {
    if (y1 == y0) y1 = y0 + 1;
    y0 = std::min(y0, 0.0);  // losses: start the axis at zero
  }
  const auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  const auto py = [&](double y) {
    const double v = log_y ? std::log10(y) : y;
    return H - B - (v - y0) / (y1 - y0) * (H - T - B);
  };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 "
    << W << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"12\" data-y-scale=\""
    << (log_y ? "log" : "linear") << "\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
    << escape(options.title) << "</text>\n";
  for (double t : ticks(x0, x1))
    o << "<line x1=\"" << px(t) << "\" y1=\"" << T << "\" x2=\"" << px(t) << "\" y2=\"" << H - B
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << px(t) << "\" y=\"" << H - B + 16
      << "\" text-anchor=\"middle\">" << num(t) << "</text>\n";
  std::vector<Tick> y_ticks;
  if (log_y) {
    y_ticks = log_ticks(y0, y1);
  } else {
    for (double t : ticks(y0, y1)) y_ticks.push_back({t, true});
  }
  for (const Tick& t : y_ticks) {
    o << "<line class=\"y-grid\" x1=\"" << L << "\" y1=\"" << py(t.value) << "\" x2=\"" << W - R << "\" y2=\""
      << py(t.value) << "\" stroke=\"" << (t.labelled ? "#dddddd" : "#f0f0f0") << "\"/>";
    if (t.labelled)
      o << "<text class=\"y-tick\" x=\"" << L - 6 << "\" y=\"" << py(t.value) + 4 << "\" text-anchor=\"end\">"
        << num(t.value) << "</text>";
    o << "\n";
  }
  const std::string y_label = options.y_label + (log_y ? " (log scale)" : "");
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">"
    << escape(options.x_label) << "</text>\n"
    << "<text x=\"16\" y=\"" << (T + H - B) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 "
    << (T + H - B) / 2 << ")\">" << escape(y_label) << "</text>\n";
  double legend_y = T + 18;
  for (const Series& s : series) {
    o << "<polyline fill=\"none\" stroke=\"" << escape(s.color) << "\" stroke-width=\"1.6\" points=\"";
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (drawn(s.x[i], s.y[i])) o << px(s.x[i]) << ',' << py(s.y[i]) << ' ';
    o << "\"/>\n";
    if (s.markers)
      for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
        if (drawn(s.x[i], s.y[i]))
          o << "<circle cx=\"" << px(s.x[i]) << "\" cy=\"" << py(s.y[i]) << "\" r=\"3\" fill=\""
            << escape(s.color) << "\"/>\n";
    o << "<line x1=\"" << W - R - 30 << "\" y1=\"" << legend_y - 4 << "\" x2=\"" << W - R - 10 << "\" y2=\""
      << legend_y - 4 << "\" stroke=\"" << escape(s.color) << "\" stroke-width=\"2\"/><text x=\""
      << W - R - 36 << "\" y=\"" << legend_y << "\" text-anchor=\"end\">" << escape(s.label) << "</text>\n";
    legend_y += 18;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace backplane::cli
