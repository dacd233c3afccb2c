// `moecore report`'s page: the charts planned from the runs' histories (which curves, which heatmaps, their
// points), and the one self-contained HTML file that draws them offline with the embedded charting library
// (ECharts). Everything taken from the files (run names, paths, keys) is escaped for where it lands: HTML text and
// attributes, or JSON inside a <script> element. Plans and writes text; reads no files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moecore/report/run_history.h"

namespace moecore::report {

// Every chart the page draws, in order; each an object the page's script renders as it is:
//   {"kind": "line", "title", "y" (axis name), "series": [{"name", "data": [[iteration, value|null], ...],
//    "color" (palette index), "dash" ("solid" | "dashed" | "dotted")}], "ref" (optional: a reference value)}
//   {"kind": "expert_load", "title", "experts" (E), "x": [iteration, ...] (the columns),
//    "cells": [[column, expert, tokens/mean tokens, tokens], ...], "entropy": [[column, nats], ...],
//    "max_entropy": ln E}
// Line charts appear only for series some run has (aux losses, MFU, per-layer losses, timers); one expert-load
// heatmap per run and MoE layer, at most kMaxHeatmapColumns columns (every n-th logged row when there are more).
nlohmann::json plan_charts(const std::vector<RunHistory>& runs);
inline constexpr size_t kMaxHeatmapColumns = 400;

// & < > " ' as entities: safe in HTML text and in quoted attribute values.
std::string html_escape(std::string_view s);
// JSON text that can sit inside <script type="application/json">: <, > and & as \u escapes (so no "</script>",
// "<!--" can end or change the element), still the same JSON to JSON.parse.
std::string json_for_script(const nlohmann::json& j);

// The whole page. `chart_library_js`: ECharts' minified script, embedded as it is (it must not contain
// "</script"); `generator`: the line naming the program (version) in the footer.
std::string render_report_html(const std::vector<RunHistory>& runs, std::string_view chart_library_js,
                               const std::string& generator);

// The page's own script (report_script.cpp): draws the planned charts with ECharts, then records on <body>
// data-charts (charts drawn) and data-errors (script errors and console.error calls seen), and sets the title.
extern const char* const kReportScript;

}  // namespace moecore::report
