// The report page's own script (see report_page.h): draws the charts planned by plan_charts with ECharts. Names from
// the data reach the page only as canvas text or through esc() in tooltips, never as markup.
#include "moecore/report/report_page.h"

namespace moecore::report {

const char* const kReportScript = R"js(
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var palette = ['#5470c6', '#ee6666', '#91cc75', '#fac858', '#73c0de', '#3ba272', '#fc8452', '#9a60b4',
                 '#ea7ccc', '#2f4554', '#c23531', '#61a0a8'];
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function num(v) {
    if (v === null || v === undefined) return 'NaN';
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return Number(v.toPrecision(5)).toString();
  }
  function tick(v) {  // axis labels: 4 significant digits, exponents only for large values
    return Math.abs(v) >= 1e6 ? v.toExponential(2) : Number(v.toPrecision(4)).toString();
  }
  var base = {animation: false, textStyle: {fontFamily: 'system-ui, sans-serif'}};
  function lineOption(c) {
    var series = c.series.map(function (s) {
      var o = {name: s.name, type: 'line', data: s.data, showSymbol: s.data.length < 60, symbolSize: 4,
               sampling: 'lttb', connectNulls: false, color: palette[s.color % palette.length],
               lineStyle: {width: 1.5, type: s.dash}};
      return o;
    });
    if (c.ref !== undefined && series.length > 0) {
      series[0].markLine = {silent: true, symbol: 'none', label: {formatter: 'ln E = ' + num(c.ref)},
                            lineStyle: {color: '#999', type: 'dashed'}, data: [{yAxis: c.ref}]};
    }
    return Object.assign({}, base, {
      title: {text: c.title, left: 8, top: 4, textStyle: {fontSize: 14}},
      legend: {type: 'scroll', top: 28, left: 8, right: 8},
      grid: {left: 72, right: 24, top: 60, bottom: 56},
      tooltip: {trigger: 'axis', formatter: function (ps) {
        if (!ps.length) return '';
        var h = 'iteration ' + esc(ps[0].value[0]);
        ps.forEach(function (p) { h += '<br>' + p.marker + esc(p.seriesName) + ': ' + esc(num(p.value[1])); });
        return h;
      }},
      xAxis: {type: 'value', name: 'iteration', nameLocation: 'middle', nameGap: 24, scale: true},
      yAxis: {type: 'value', name: c.y, scale: true, nameLocation: 'middle', nameGap: 48,
              axisLabel: {formatter: tick},
              max: c.ref === undefined ? null : function (v) { return Math.max(v.max, c.ref); }},
      dataZoom: [{type: 'inside'}, {type: 'slider', height: 14, bottom: 4}],
      series: series
    });
  }
  function expertLoadOption(c) {
    var experts = [];
    for (var e = 0; e < c.experts; e++) experts.push(String(e));
    var cols = c.x.map(String);
    return Object.assign({}, base, {
      title: {text: c.title, left: 8, top: 4, textStyle: {fontSize: 14}},
      tooltip: {formatter: function (p) {
        if (p.seriesType === 'heatmap')
          return 'iteration ' + esc(c.x[p.value[0]]) + ', expert ' + esc(p.value[1]) + '<br>tokens: ' +
                 esc(p.value[3]) + ' (' + esc(num(p.value[2])) + ' × mean)';
        return 'iteration ' + esc(c.x[p.value[0]]) + '<br>router entropy: ' + esc(num(p.value[1])) + ' nats';
      }},
      grid: [{left: 64, right: 90, top: 48, height: '50%'}, {left: 64, right: 90, bottom: 48, height: '18%'}],
      xAxis: [{type: 'category', data: cols, gridIndex: 0, axisLabel: {show: false}},
              {type: 'category', data: cols, gridIndex: 1, name: 'iteration', nameLocation: 'middle', nameGap: 28}],
      yAxis: [{type: 'category', data: experts, gridIndex: 0, name: 'expert'},
              {type: 'value', gridIndex: 1, name: 'entropy', scale: true, splitNumber: 2,
               axisLabel: {formatter: tick}}],
      visualMap: {type: 'continuous', min: 0, max: 2, seriesIndex: 0, dimension: 2, right: 4, top: 36,
                  itemHeight: 140, text: ['≥2× mean', 'no tokens'], calculable: false,
                  inRange: {color: ['#313695', '#74add1', '#ffffbf', '#f46d43', '#a50026']}},
      series: [{type: 'heatmap', xAxisIndex: 0, yAxisIndex: 0, data: c.cells, progressive: 0},
               {type: 'line', xAxisIndex: 1, yAxisIndex: 1, data: c.entropy, showSymbol: false,
                color: '#555', lineStyle: {width: 1.5},
                markLine: {silent: true, symbol: 'none', label: {formatter: 'ln E'},
                           lineStyle: {color: '#999', type: 'dashed'}, data: [{yAxis: c.max_entropy}]}}]
    });
  }
  var host = document.getElementById('charts');
  var drawn = 0;
  data.charts.forEach(function (c, i) {
    var div = document.createElement('div');
    div.className = 'chart' + (c.kind === 'expert_load' ? ' tall' : '');
    div.id = 'chart-' + i;
    div.setAttribute('data-kind', c.kind);
    host.appendChild(div);
    try {
      var chart = echarts.init(div, null, {renderer: 'canvas'});
      chart.setOption(c.kind === 'expert_load' ? expertLoadOption(c) : lineOption(c));
      window.addEventListener('resize', function () { chart.resize(); });
      drawn++;
    } catch (err) {
      console.error('chart ' + i + ' (' + c.title + '): ' + err);
    }
  });
  document.body.setAttribute('data-charts', String(drawn));
  document.title = document.title + ' (' + drawn + ' charts)';
})();
)js";

}  // namespace moecore::report
