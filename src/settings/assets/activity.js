// The settings page's Activity chart: credits spent per UTC day, a bar
// per day stacked by model, drawn as SVG with DOM calls (no library, no
// markup parsed: model names come from clients and upstreams). app.js
// fetches GET /api/v1/activity and hands its rows here.
'use strict';

(() => {
  const SVG = 'http://www.w3.org/2000/svg';
  // The chart's own coordinates; CSS scales it to the section's width.
  const WIDTH = 720;
  const HEIGHT = 240;
  const LEFT = 56; // room for the axis's figures
  const BOTTOM = 28; // room for the first and last day
  const TOP = 8;
  // As many colours as app.css defines (.series-0 … .series-7); more
  // models than that reuse them in turn, each still named by its title.
  const SERIES = 8;

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Every UTC day from `first` to `last` (YYYY-MM-DD), in order.
  function days(first, last) {
    const all = [];
    const at = new Date(first + 'T00:00:00Z');
    const end = new Date(last + 'T00:00:00Z');
    while (at <= end && all.length < 400) {
      all.push(at.toISOString().slice(0, 10));
      at.setUTCDate(at.getUTCDate() + 1);
    }
    return all;
  }

  // Draws `rows` (the API's: date, model, usage, …) into the <svg>
  // `chart` for the days `first` to `last`: one <rect> per day and model
  // that spent credits, its <title> naming both and the amount, stacked
  // in the order of `models` (the models' colours follow that order).
  // `format` writes an amount of credits. Returns nothing; an empty
  // window draws the axis alone.
  function draw(chart, rows, models, first, last, format) {
    const shown = days(first, last);
    const spend = rows.filter((row) => Number(row.usage) > 0);
    const totals = new Map();
    for (const row of spend) totals.set(row.date, (totals.get(row.date) || 0) + Number(row.usage));
    const most = Math.max(0, ...totals.values());
    const plotWidth = WIDTH - LEFT;
    const plotHeight = HEIGHT - TOP - BOTTOM;
    const slot = plotWidth / Math.max(1, shown.length);
    const barWidth = Math.max(1, slot * 0.7);
    const scale = most > 0 ? plotHeight / most : 0;
    const base = TOP + plotHeight;

    chart.setAttribute('viewBox', '0 0 ' + WIDTH + ' ' + HEIGHT);
    const parts = [];
    parts.push(svg('line', { x1: LEFT, y1: base, x2: WIDTH, y2: base, class: 'axis' }));
    parts.push(svg('text', { x: LEFT - 6, y: base, class: 'tick', 'text-anchor': 'end' }, '0'));
    if (most > 0) {
      parts.push(svg('line', { x1: LEFT, y1: TOP, x2: WIDTH, y2: TOP, class: 'grid' }));
      parts.push(svg('text', { x: LEFT - 6, y: TOP + 10, class: 'tick', 'text-anchor': 'end' }, format(most)));
    }
    if (shown.length) {
      parts.push(svg('text', { x: LEFT, y: HEIGHT - 6, class: 'tick' }, shown[0]));
      parts.push(svg('text', { x: WIDTH, y: HEIGHT - 6, class: 'tick', 'text-anchor': 'end' }, shown[shown.length - 1]));
    }
    const stacked = new Map(); // day → height drawn so far
    const ordered = spend.slice().sort((a, b) => models.indexOf(a.model) - models.indexOf(b.model));
    for (const row of ordered) {
      const index = shown.indexOf(row.date);
      if (index < 0) continue;
      const below = stacked.get(row.date) || 0;
      // At least a pixel: a tiny spend beside a large one still shows.
      const height = Math.max(1, Number(row.usage) * scale);
      stacked.set(row.date, below + height);
      const bar = svg('rect', {
        x: (LEFT + index * slot + (slot - barWidth) / 2).toFixed(2),
        y: (base - below - height).toFixed(2),
        width: barWidth.toFixed(2),
        height: height.toFixed(2),
        class: 'bar series-' + (models.indexOf(row.model) % SERIES),
        'data-date': row.date,
        'data-model': row.model,
      });
      bar.append(svg('title', {}, row.date + ' · ' + row.model + ': ' + format(row.usage) + ' credits'));
      parts.push(bar);
    }
    chart.replaceChildren(...parts);
  }

  // The legend: one item per model, in the chart's colour.
  function legend(list, models) {
    list.replaceChildren(...models.map((model, index) => {
      const item = document.createElement('li');
      const swatch = svg('svg', { viewBox: '0 0 10 10', width: 10, height: 10, 'aria-hidden': 'true' });
      swatch.append(svg('rect', { width: 10, height: 10, class: 'series-' + (index % SERIES) }));
      item.append(swatch, document.createTextNode(' ' + model));
      return item;
    }));
  }

  globalThis.modelgateActivity = Object.freeze({ draw, legend });
})();
