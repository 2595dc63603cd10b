#include "train/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace precis::train {

namespace {

constexpr double kWidth = 720, kHeight = 440, kLeft = 70, kRight = 160, kTop = 40, kBottom = 50;
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// One chart as an SVG group at (left, top): title, frame, 5 ticks per axis, a line per series, a legend.
std::string chart(const PlotPanel& panel, double left, double top) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : panel.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::string svg = "<g transform=\"translate(" + num(left) + "," + num(top) + ")\">\n";
  svg += "<text x=\"" + num(kWidth / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + escape(panel.title) +
         "</text>\n";
  svg += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    double xv = x0 + (x1 - x0) * i / 5, yv = y0 + (y1 - y0) * i / 5;
    svg += "<text x=\"" + num(px(xv)) + "\" y=\"" + num(kTop + ph + 18) + "\" text-anchor=\"middle\">" + num(xv) +
           "</text>\n";
    svg +=
        "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(py(yv) + 4) + "\" text-anchor=\"end\">" + num(yv) + "</text>\n";
    svg += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + pw) + "\" y1=\"" + num(py(yv)) + "\" y2=\"" +
           num(py(yv)) + "\" stroke=\"#eee\"/>\n";
  }
  svg += "<text x=\"" + num(kLeft + pw / 2) + "\" y=\"" + num(kHeight - 10) + "\" text-anchor=\"middle\">" +
         escape(panel.x_label) + "</text>\n";
  svg += "<text transform=\"translate(16," + num(kTop + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         escape(panel.y_label) + "</text>\n";
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const auto& s = panel.series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string points;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) points += num(px(s.x[i])) + "," + num(py(s.y[i])) + " ";
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"1.5\" points=\"" + points +
           "\"><title>" + escape(s.label) + "</title></polyline>\n";
    double ly = kTop + 14 + 18.0 * static_cast<double>(k);
    svg += "<line x1=\"" + num(kLeft + pw + 12) + "\" x2=\"" + num(kLeft + pw + 32) + "\" y1=\"" + num(ly - 4) +
           "\" y2=\"" + num(ly - 4) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + num(kLeft + pw + 36) + "\" y=\"" + num(ly) + "\">" + escape(s.label) + "</text>\n";
  }
  return svg + "</g>\n";
}

std::string svg_open(double width, double height) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
         "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

}  // namespace

void write_plot_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    PRECIS_CHECK(out.is_open(), "cannot write '", path, "': check that its directory exists and is writable");
    out << text;
    PRECIS_CHECK(out.good(), "writing '", path, "' failed");
  }
  std::filesystem::rename(tmp, path);
}

void write_svg_plot(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::string& y_label, const std::vector<PlotSeries>& series) {
  write_plot_file(path,
                  svg_open(kWidth, kHeight) + chart(PlotPanel{title, x_label, y_label, series}, 0, 0) + "</svg>\n");
}

void write_svg_panels(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels,
                      int columns) {
  PRECIS_CHECK(columns >= 1, "plot: columns must be >= 1");
  const size_t rows = (panels.size() + static_cast<size_t>(columns) - 1) / static_cast<size_t>(columns);
  const double header = 36;
  std::string svg = svg_open(kWidth * std::min<double>(columns, std::max<size_t>(panels.size(), 1)),
                             header + kHeight * static_cast<double>(rows));
  svg += "<text x=\"12\" y=\"24\" font-size=\"17\">" + escape(title) + "</text>\n";
  for (size_t i = 0; i < panels.size(); ++i)
    svg += chart(panels[i], kWidth * static_cast<double>(i % columns),
                 header + kHeight * static_cast<double>(i / columns));
  write_plot_file(path, svg + "</svg>\n");
}

void write_svg_loglog(const std::string& path, const std::string& title, const std::string& x_label,
                      const std::string& y_label, const std::vector<PlotSeries>& lines,
                      const std::vector<PlotPoint>& points, const std::vector<PlotPoint>& marks) {
  // The axes span every positive value, in whole decades.
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto extend = [&](double x, double y) {
    if (!(x > 0) || !(y > 0) || !std::isfinite(x) || !std::isfinite(y)) return;
    x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  };
  for (const auto& l : lines)
    for (size_t i = 0; i < l.x.size(); ++i) extend(l.x[i], l.y[i]);
  for (const auto& p : points) extend(p.x, p.y);
  if (!std::isfinite(x0)) x0 = 1, x1 = 10, y0 = 1, y1 = 10;
  const double lx0 = std::floor(std::log10(x0)), lx1 = std::max(std::ceil(std::log10(x1)), lx0 + 1);
  const double ly0 = std::floor(std::log10(y0)), ly1 = std::max(std::ceil(std::log10(y1)), ly0 + 1);
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (std::log10(x) - lx0) / (lx1 - lx0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (std::log10(y) - ly0) / (ly1 - ly0)) * ph; };
  auto inside = [&](double x, double y) { return x > 0 && y > 0 && std::isfinite(px(x)) && std::isfinite(py(y)); };

  std::string svg = svg_open(kWidth, kHeight);
  svg += "<text x=\"" + num(kWidth / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + escape(title) +
         "</text>\n";
  svg += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (double e = lx0; e <= lx1; ++e)
    svg += "<text x=\"" + num(px(std::pow(10, e))) + "\" y=\"" + num(kTop + ph + 18) + "\" text-anchor=\"middle\">1e" +
           num(e) + "</text>\n";
  for (double e = ly0; e <= ly1; ++e) {
    const double y = py(std::pow(10, e));
    svg += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">1e" + num(e) + "</text>\n";
    svg += "<line x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + pw) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
           "\" stroke=\"#eee\"/>\n";
  }
  svg += "<text x=\"" + num(kLeft + pw / 2) + "\" y=\"" + num(kHeight - 10) + "\" text-anchor=\"middle\">" +
         escape(x_label) + "</text>\n";
  svg += "<text transform=\"translate(16," + num(kTop + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         escape(y_label) + "</text>\n";
  for (size_t k = 0; k < lines.size(); ++k) {
    const char* color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string xy;
    for (size_t i = 0; i < lines[k].x.size(); ++i)
      if (inside(lines[k].x[i], lines[k].y[i])) xy += num(px(lines[k].x[i])) + "," + num(py(lines[k].y[i])) + " ";
    svg += "<polyline class=\"line\" fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"" +
           xy + "\"/>\n";
    double ly = kTop + 14 + 18.0 * static_cast<double>(k);
    svg += "<line x1=\"" + num(kLeft + pw + 12) + "\" x2=\"" + num(kLeft + pw + 32) + "\" y1=\"" + num(ly - 4) +
           "\" y2=\"" + num(ly - 4) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + num(kLeft + pw + 36) + "\" y=\"" + num(ly) + "\">" + escape(lines[k].label) + "</text>\n";
  }
  for (const PlotPoint& m : marks) {
    if (!inside(m.x, std::pow(10, ly0))) continue;
    svg += "<line class=\"mark\" x1=\"" + num(px(m.x)) + "\" x2=\"" + num(px(m.x)) + "\" y1=\"" + num(kTop) +
           "\" y2=\"" + num(kTop + ph) + "\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>\n";
    svg += "<text x=\"" + num(px(m.x) + 3) + "\" y=\"" + num(kTop + ph - 6) + "\" fill=\"#555\">" + escape(m.label) +
           "</text>\n";
  }
  for (const PlotPoint& p : points) {
    if (!inside(p.x, p.y)) continue;
    svg += "<circle class=\"point\" cx=\"" + num(px(p.x)) + "\" cy=\"" + num(py(p.y)) +
           "\" r=\"4\" fill=\"#d62728\" fill-opacity=\"0.7\"><title>" + escape(p.label) + "</title></circle>\n";
    svg += "<text x=\"" + num(px(p.x) + 6) + "\" y=\"" + num(py(p.y) - 4) + "\" font-size=\"10\">" + escape(p.label) +
           "</text>\n";
  }
  svg += "</svg>\n";
  write_plot_file(path, svg);
}

}  // namespace precis::train
