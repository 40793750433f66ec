// rankpack dashboard: reads api/view (its own server, relative URL) every couple of seconds
// and redraws. Every text goes in through textContent, every chart is SVG built with
// attributes only (no markup from data, no inline style: the page's CSP allows neither).
// For tests, each Simulation's section carries data-residual-points and data-heat-columns
// (what was drawn), and <body> data-polls (views drawn so far).
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b',
  '#e377c2', '#7f7f7f', '#bcbd22', '#17becf', '#393b79', '#637939', '#8c6d31', '#843c39',
  '#7b4173', '#3182bd'];
const VIRIDIS = ['#440154', '#472d7b', '#3b528b', '#2c728e', '#21918c', '#28ae80',
  '#5ec962', '#addc30', '#fde725'];
const MISSING = '#e6e6e6';

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function sv(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function num(v, digits) {
  return typeof v === 'number' && isFinite(v) ? v.toFixed(digits) : '-';
}

function clock(unixS) {
  if (typeof unixS !== 'number') return '-';
  const d = new Date(unixS * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map((x) => String(x).padStart(2, '0')).join(':');
}

function ago(s) {
  const a = Math.abs(s);
  if (a < 1) return 'now';
  if (a < 120) return `${a.toFixed(0)} s ago`;
  return `${(a / 60).toFixed(a < 600 ? 1 : 0)} min ago`;
}

function viridis(x) {
  const t = Math.min(1, Math.max(0, x)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(t));
  const f = t - i;
  const a = VIRIDIS[i], b = VIRIDIS[i + 1];
  const mix = (k) => Math.round(parseInt(a.slice(k, k + 2), 16) * (1 - f) +
    parseInt(b.slice(k, k + 2), 16) * f).toString(16).padStart(2, '0');
  return `#${mix(1)}${mix(3)}${mix(5)}`;
}

function tile(label, value, note, tone) {
  const t = el('div', {class: `tile ${tone || ''}`});
  t.append(el('div', {class: 'l'}, label), el('div', {class: 'v'}, value));
  if (note) t.append(el('div', {class: 'n'}, note));
  return t;
}

function frame(w, h) {
  return sv('svg', {viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: 'img', class: 'plot'});
}

function axisBox(s, m, w, h) {
  s.append(sv('rect', {x: m.l, y: m.t, width: w - m.l - m.r, height: h - m.t - m.b,
    fill: 'none', stroke: '#c9d0dc'}));
}

// residuals over iterations, log scale; returns [figure, points drawn]
function residualChart(sim) {
  const fig = el('figure', {class: 'chart'});
  fig.append(el('figcaption', {}, 'Initial residual of each field over iterations (log scale)'));
  const fields = sim.residuals.fields, points = sim.residuals.points;
  const W = 560, H = 250, m = {l: 54, r: 12, t: 10, b: 34};
  const s = frame(W, H);
  axisBox(s, m, W, H);
  const values = [];
  for (const [, row] of points) for (const v of row) if (typeof v === 'number' && v > 0) values.push(v);
  if (!points.length || !values.length) {
    s.append(sv('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'}, 'no residuals yet'));
    fig.append(s);
    return [fig, 0];
  }
  const iters = points.map((p) => p[0]);
  let x0 = Math.min(...iters), x1 = Math.max(...iters);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  let y0 = Math.floor(Math.log10(Math.min(...values)));
  let y1 = Math.ceil(Math.log10(Math.max(...values)));
  if (y1 === y0) y1 += 1;
  const X = (i) => m.l + (i - x0) / (x1 - x0) * (W - m.l - m.r);
  const Y = (v) => H - m.b - (Math.log10(v) - y0) / (y1 - y0) * (H - m.t - m.b);
  const step = Math.max(1, Math.ceil((y1 - y0) / 8));
  for (let d = y0; d <= y1; d += step) {
    const y = Y(10 ** d);
    s.append(sv('line', {x1: m.l, x2: W - m.r, y1: y, y2: y, stroke: '#eef1f6'}));
    s.append(sv('text', {x: m.l - 6, y: y + 4, 'text-anchor': 'end'}, `1e${d}`));
  }
  for (let k = 0; k <= 4; k++) {
    const i = x0 + (x1 - x0) * k / 4;
    s.append(sv('text', {x: X(i), y: H - m.b + 14, 'text-anchor': 'middle'}, Math.round(i)));
  }
  s.append(sv('text', {x: (W + m.l) / 2, y: H - 4, 'text-anchor': 'middle', class: 'label'},
    'iteration'));
  const legend = el('ul', {class: 'legend'});
  fields.forEach((name, f) => {
    const colour = PALETTE[f % PALETTE.length];
    const pts = points.filter((p) => typeof p[1][f] === 'number' && p[1][f] > 0)
      .map((p) => `${X(p[0]).toFixed(1)},${Y(p[1][f]).toFixed(1)}`);
    if (pts.length === 1) {
      const [cx, cy] = pts[0].split(',');
      s.append(sv('circle', {cx, cy, r: 2.5, fill: colour}));
    } else if (pts.length) {
      s.append(sv('polyline', {points: pts.join(' '), fill: 'none', stroke: colour,
        'stroke-width': 1.6}));
    }
    const item = el('li');
    const sw = sv('svg', {width: 14, height: 4});
    sw.append(sv('rect', {width: 14, height: 4, fill: colour}));
    item.append(sw, document.createTextNode(name));
    legend.append(item);
  });
  fig.append(s, legend);
  return [fig, points.length];
}

// ranks x time, one column per read while it runs; returns [figure, columns drawn]
function heatMap(sim) {
  const fig = el('figure', {class: 'chart'});
  fig.append(el('figcaption', {},
    'Duty per rank over time (share of time computing, outside MPI; one column per read)'));
  const ranks = sim.heat.ranks, cols = sim.heat.columns;
  const n = Math.max(1, ranks.length);
  const W = 560, m = {l: 54, r: 60, t: 10, b: 34};
  const rowH = Math.max(4, Math.min(28, 180 / n));
  const H = m.t + m.b + rowH * n;
  const s = frame(W, H);
  if (!cols.length) {
    s.append(sv('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'}, 'not running: no columns yet'));
    fig.append(s);
    return [fig, 0];
  }
  const cw = (W - m.l - m.r) / cols.length;
  const cells = sv('g', {'shape-rendering': 'crispEdges'});
  cols.forEach(([, duty], c) => {
    duty.forEach((d, r) => {
      cells.append(sv('rect', {x: (m.l + c * cw).toFixed(2), y: (m.t + r * rowH).toFixed(2),
        width: (cw + 0.6).toFixed(2), height: (rowH + 0.6).toFixed(2),
        fill: typeof d === 'number' ? viridis(d) : MISSING}));
    });
  });
  s.append(cells);
  axisBox(s, m, W, H);
  const labelEvery = Math.max(1, Math.ceil(n / 12));
  ranks.forEach((id, r) => {
    if (r % labelEvery === 0) {
      s.append(sv('text', {x: m.l - 6, y: m.t + (r + 0.5) * rowH + 4, 'text-anchor': 'end'},
        `rank ${id}`));
    }
  });
  s.append(sv('text', {x: m.l, y: H - m.b + 14, 'text-anchor': 'start'}, ago(cols[0][0])));
  s.append(sv('text', {x: W - m.r, y: H - m.b + 14, 'text-anchor': 'end'},
    ago(cols[cols.length - 1][0])));
  s.append(sv('text', {x: (W + m.l - m.r) / 2, y: H - 4, 'text-anchor': 'middle',
    class: 'label'}, `time (${cols.length} reads)`));
  const barX = W - m.r + 14, barH = H - m.t - m.b;
  for (let k = 0; k < 20; k++) {
    s.append(sv('rect', {x: barX, y: m.t + barH * (1 - (k + 1) / 20), width: 10,
      height: barH / 20 + 0.3, fill: viridis((k + 0.5) / 20)}));
  }
  s.append(sv('text', {x: barX + 13, y: m.t + 9}, '1'));
  s.append(sv('text', {x: barX + 13, y: m.t + barH}, '0'));
  fig.append(s);
  return [fig, cols.length];
}

// each rank's request against its CPU use now, and the sums over time
function usageChart(sim) {
  const fig = el('figure', {class: 'chart'});
  fig.append(el('figcaption', {},
    'Requests (cores) against CPU used, per rank now and summed over time'));
  const W = 560, H = 250, m = {l: 54, r: 12, t: 10, b: 34}, split = 300;
  const s = frame(W, H);
  const ranks = sim.ranks;
  const req = ranks.map((r) => (r.requestMillis || 0) / 1000);
  const used = ranks.map((r) => r.cpuCores || 0);
  const usage = sim.usage;
  const top = Math.max(0.1, ...req, ...used, ...usage.map((u) => Math.max(u[1] / 1000, u[2])));
  const Y = (v) => H - m.b - v / top * (H - m.t - m.b);
  for (let k = 0; k <= 4; k++) {
    const v = top * k / 4, y = Y(v);
    s.append(sv('line', {x1: m.l, x2: W - m.r, y1: y, y2: y, stroke: '#eef1f6'}));
    s.append(sv('text', {x: m.l - 6, y: y + 4, 'text-anchor': 'end'}, v.toFixed(2)));
  }
  const bw = Math.min(24, (split - m.l - 10) / Math.max(1, ranks.length) / 2.4);
  ranks.forEach((r, i) => {
    const x = m.l + 6 + i * bw * 2.4;
    s.append(sv('rect', {x, y: Y(req[i]), width: bw, height: Y(0) - Y(req[i]), fill: '#9fb7ec'}));
    s.append(sv('rect', {x: x + bw, y: Y(used[i]), width: bw, height: Y(0) - Y(used[i]),
      fill: '#2459d6'}));
    if (ranks.length <= 16) {
      s.append(sv('text', {x: x + bw, y: H - m.b + 14, 'text-anchor': 'middle'}, r.rank));
    }
  });
  s.append(sv('text', {x: (m.l + split) / 2, y: H - 4, 'text-anchor': 'middle', class: 'label'},
    'rank (now)'));
  const x0 = split + 16, x1 = W - m.r;
  s.append(sv('line', {x1: x0 - 8, x2: x0 - 8, y1: m.t, y2: H - m.b, stroke: '#c9d0dc'}));
  if (usage.length >= 1) {
    const t0 = usage[0][0], t1 = Math.max(t0 + 1, usage[usage.length - 1][0]);
    const X = (t) => x0 + (t - t0) / (t1 - t0) * (x1 - x0);
    for (const [k, colour, scale] of [[1, '#9fb7ec', 1000], [2, '#2459d6', 1]]) {
      const pts = usage.map((u) => `${X(u[0]).toFixed(1)},${Y(u[k] / scale).toFixed(1)}`);
      s.append(sv('polyline', {points: pts.join(' '), fill: 'none', stroke: colour,
        'stroke-width': 1.8}));
    }
    s.append(sv('text', {x: x0, y: H - m.b + 14}, ago(usage[0][0])));
    s.append(sv('text', {x: x1, y: H - m.b + 14, 'text-anchor': 'end'},
      ago(usage[usage.length - 1][0])));
  }
  s.append(sv('text', {x: (x0 + x1) / 2, y: H - 4, 'text-anchor': 'middle', class: 'label'},
    'all ranks, over time'));
  axisBox(s, m, W, H);
  const legend = el('ul', {class: 'legend'});
  for (const [name, colour] of [['request', '#9fb7ec'], ['CPU used', '#2459d6']]) {
    const item = el('li');
    const sw = sv('svg', {width: 12, height: 10});
    sw.append(sv('rect', {width: 12, height: 10, fill: colour}));
    item.append(sw, document.createTextNode(name));
    legend.append(item);
  }
  fig.append(s, legend);
  return fig;
}

function table(columns, rows, textCols) {
  const t = el('table', {class: 'data'});
  const head = el('tr');
  columns.forEach((c, i) => head.append(el('th', textCols.includes(i) ? {class: 't'} : {}, c)));
  const thead = el('thead');
  thead.append(head);
  const body = el('tbody');
  for (const row of rows) {
    const tr = el('tr');
    row.forEach((v, i) => tr.append(el('td', textCols.includes(i) ? {class: 't'} : {}, v)));
    body.append(tr);
  }
  t.append(thead, body);
  const wrap = el('div', {class: 'tablewrap'});
  wrap.append(t);
  return wrap;
}

function simSection(sim) {
  const sec = el('section', {class: 'block sim', 'data-sim': sim.name,
    'data-namespace': sim.namespace, 'data-phase': sim.phase});
  sec.append(el('h2', {}, `${sim.name} \u2014 ${sim.phase}`));
  const bits = [sim.case && `case ${sim.case}`, sim.progress && `${sim.progress} iterations`,
    sim.eta && `ETA ${sim.eta}`, sim.nodes && `nodes ${sim.nodes}`,
    sim.reason && `reason ${sim.reason}`].filter(Boolean);
  sec.append(el('p', {class: 'intro'}, bits.join(' \u00b7 ')));
  const charts = el('div', {class: 'charts'});
  const [res, points] = residualChart(sim);
  const [heat, columns] = heatMap(sim);
  charts.append(res, heat, usageChart(sim));
  sec.setAttribute('data-residual-points', points);
  sec.setAttribute('data-heat-columns', columns);
  const side = el('div');
  side.append(el('h3', {}, 'Ranks'));
  side.append(table(['rank', 'node', 'request', 'used', 'duty', 'wait'],
    sim.ranks.map((r) => [r.rank, r.node || '-',
      r.requestMillis === null ? '-' : `${r.requestMillis.toFixed(0)}m`,
      num(r.cpuCores, 2), num(r.duty, 2), r.wait || '-']), [1, 5]));
  if (sim.rankCount > sim.ranks.length) {
    side.append(el('p', {class: 'tablenote'}, `${sim.rankCount - sim.ranks.length} more ranks not drawn`));
  }
  side.append(el('h3', {}, 'Recent resizes and wait-mode switches'));
  if (sim.recent.length) {
    side.append(table(['time', 'reason', 'message'],
      sim.recent.map((e) => [e.time || '-', e.reason, e.message || '']), [0, 1, 2]));
  } else {
    side.append(el('p', {class: 'empty'}, 'none seen (or Events may not be read)'));
  }
  charts.append(side);
  sec.append(charts);
  return sec;
}

function drawGain(gain) {
  if (typeof gain.value === 'number') {
    return [tile('co-location gain so far', `${gain.value.toFixed(2)}\u00d7`,
      `one after another ${gain.workS.toFixed(0)} s; side by side ${gain.wallS.toFixed(0)} s`,
      gain.value > 1.02 ? 'good' : ''), ''];
  }
  return [tile('co-location gain so far', 'no estimate yet', '', 'warn'), gain.why || ''];
}

function draw(view) {
  const polled = view.polledAt === null ? 'not read yet' : `last read ${clock(view.polledAt)}`;
  document.getElementById('source').textContent =
    `namespace ${view.namespace} \u00b7 read every ${view.intervalS} s \u00b7 ${polled}`;
  const status = document.getElementById('status');
  status.textContent = view.error ? `the last read failed: ${view.error}` : '';
  status.className = view.error ? 'status bad' : 'status';
  const sims = view.simulations;
  const count = (p) => sims.filter((s) => s.phase === p).length;
  const [gainTile, why] = drawGain(view.gain);
  document.getElementById('tiles').replaceChildren(
    tile('running', count('Running'), 'Simulations'),
    tile('queued', count('Queued') + count('Starting'), 'queued or starting'),
    tile('ended', count('Succeeded') + count('Failed'), 'still listed'),
    gainTile);
  document.getElementById('gain-why').textContent = why;
  const body = document.querySelector('#queue tbody');
  body.replaceChildren(...sims.map((s) => {
    const tr = el('tr');
    const cells = [[s.name, 1], [s.phase, 1], [s.progress || '-', 0], [s.eta || '-', 1],
      [num(s.duty.mean, 2), 0], [num(s.duty.min, 2), 0], [num(s.efficiency, 2), 0],
      [s.nodes || '-', 1], [s.resizes === null ? '-' : s.resizes, 0]];
    for (const [v, t] of cells) tr.append(el('td', t ? {class: 't'} : {}, v));
    return tr;
  }));
  document.getElementById('queue-note').textContent = (sims.length ? '' :
    'none here that these credentials may read') +
    (view.more > 0 ? `${view.more} more not shown (the dashboard follows the first ${sims.length})` : '');
  const nodes = document.querySelector('#nodes tbody');
  const note = document.getElementById('nodes-note');
  if (view.nodes === null) {
    nodes.replaceChildren();
    note.textContent = 'not shown: these credentials may not read nodes';
  } else {
    note.textContent = '';
    nodes.replaceChildren(...view.nodes.map((n) => {
      const tr = el('tr');
      tr.append(el('td', {class: 't'}, n.name), el('td', {}, n.allocatable || '-'),
        el('td', {}, `${num(n.requestedMillis, 0)}m`), el('td', {}, num(n.usedCores, 2)),
        el('td', {}, num(n.usefulCores, 2)));
      return tr;
    }));
  }
  const shown = sims.filter((s) => s.phase === 'Running' || s.residuals.points.length ||
    s.heat.columns.length);
  document.getElementById('sims').replaceChildren(...shown.map(simSection));
  document.body.setAttribute('data-polls', Number(document.body.getAttribute('data-polls')) + 1);
}

let refreshS = 2;

async function refresh() {
  try {
    const answer = await fetch('api/view', {cache: 'no-store'});
    if (!answer.ok) throw new Error(`the dashboard answered ${answer.status}`);
    const view = await answer.json();
    refreshS = view.refreshS || refreshS;
    draw(view);
  } catch (err) {
    const status = document.getElementById('status');
    status.textContent = `no view from the dashboard's server: ${err.message}`;
    status.className = 'status bad';
  }
  setTimeout(refresh, refreshS * 1000);
}

document.addEventListener('DOMContentLoaded', refresh);
