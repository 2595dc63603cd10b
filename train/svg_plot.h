// Plots written as SVG (no dependencies): line charts, one or a grid of panels in one file
// (precis plot, the precision sweep), and the log-log roofline of the op profile.
#pragma once

#include <string>
#include <vector>

namespace precis::train {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;  // points with a non-finite y are left out
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
};

// Writes `text` to `path` through path.tmp and a rename, so a reader never sees half a plot or table.
void write_plot_file(const std::string& path, const std::string& text);
// Writes an SVG line chart of `series` to `path` (tmp + rename), with axes, ticks and a legend.
void write_svg_plot(const std::string& path, const std::string& title, const std::string& x_label,
                    const std::string& y_label, const std::vector<PlotSeries>& series);
// Writes the panels as a grid `columns` wide under one title, each a chart as above.
void write_svg_panels(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels,
                      int columns = 2);

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
