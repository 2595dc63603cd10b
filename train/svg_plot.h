// Minimal plots written as SVG (no dependencies): loss curves for the
// precision sweep, the roofline of the op profile.
#pragma once

#include <string>
#include <vector>

namespace precis::train {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
};

// Writes an SVG line chart of `series` to `path` (tmp + rename), with axes, ticks and a legend.
void write_svg_plot(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::string& y_label, const std::vector<PlotSeries>& series);

struct PlotPoint {
  std::string label;
  double x = 0, y = 0;
};

// A log-log chart: `lines` drawn as polylines (class "line") with a legend, `points` as dots
// (class "point", each labelled, its label also a hover title), and a dashed vertical line at
// each of `marks` (class "mark", labelled). Values <= 0 are left out.
void write_svg_loglog(const std::string& path, const std::string& title, const std::string& x_label,
                      const std::string& y_label, const std::vector<PlotSeries>& lines,
                      const std::vector<PlotPoint>& points, const std::vector<PlotPoint>& marks);

}  // namespace precis::train
