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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

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

}  // namespace

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series) {
  constexpr double W = 720, H = 420, L = 70, R = 20, T = 40, B = 55;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : series)
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  y0 = std::min(y0, 0.0);  // losses: start the axis at zero
  const auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  const auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << escape(title)
    << "</text>\n";
  for (double t : ticks(x0, x1))
    o << "<line x1=\"" << px(t) << "\" y1=\"" << T << "\" x2=\"" << px(t) << "\" y2=\"" << H - B
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << px(t) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
      << num(t) << "</text>\n";
  for (double t : ticks(y0, y1))
    o << "<line x1=\"" << L << "\" y1=\"" << py(t) << "\" x2=\"" << W - R << "\" y2=\"" << py(t)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">"
      << num(t) << "</text>\n";
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">" << escape(x_label)
    << "</text>\n"
    << "<text x=\"16\" y=\"" << (T + H - B) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 "
    << (T + H - B) / 2 << ")\">" << escape(y_label) << "</text>\n";
  double legend_y = T + 16;
  for (const Series& s : series) {
    o << "<polyline fill=\"none\" stroke=\"" << escape(s.color) << "\" stroke-width=\"1.6\" points=\"";
    for (std::size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) o << px(s.x[i]) << ',' << py(s.y[i]) << ' ';
    o << "\"/>\n<text x=\"" << W - R - 8 << "\" y=\"" << legend_y << "\" text-anchor=\"end\" fill=\""
      << escape(s.color) << "\">" << escape(s.label) << "</text>\n";
    legend_y += 16;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace backplane::cli
