// Charts: a uPlot time chart per panel that is updated in place with setData (re-created only
// when its set of series changes), alert and version markers, series alignment and sparklines.

import { getJSON } from './api.js';
import { h } from './dom.js';
import { axisValues, byUnit } from './format.js';

/* global uPlot */

export const PALETTE = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#4d7c0f', '#9333ea', '#475569'];
const MIB = 1024 ** 2;
const GIB = 1024 ** 3;
/** Tick steps for byte axes: round MiB / GiB numbers instead of decimal ones. */
const BYTE_INCRS = [
  ...[1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((x) => x * MIB),
  ...[1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 64, 80, 128, 256, 512, 1024].map((x) => x * GIB),
];
export const SEVERITY_COLOR = { critical: '#dc2626', warning: '#d97706', info: '#2563eb' };

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
/** uPlot merges options key by key: a key present with `undefined` would erase its default. */
const defined = (o) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));

/** Non-null y values in a uPlot data table (what a chart actually draws). */
export function countPoints(data) {
  let n = 0;
  for (let s = 1; s < data.length; s++) for (const v of data[s]) if (isNum(v)) n++;
  return n;
}

/**
 * Align series with their own timestamps ({t: [unix s], v: []}) onto one x array, rounding
 * times to `res` seconds so scrapes a few ms apart share a slot. Returns [t, ...ys].
 */
export function alignSeries(list, res = 1) {
  const rounded = list.map((s) => s.t.map((t) => Math.round(t / res) * res));
  const all = new Set();
  for (const r of rounded) for (const t of r) all.add(t);
  const t = [...all].sort((a, b) => a - b);
  const index = new Map(t.map((x, i) => [x, i]));
  const ys = list.map((s, k) => {
    const y = new Array(t.length).fill(null);
    rounded[k].forEach((tt, i) => {
      const v = s.v[i];
      y[index.get(tt)] = isNum(v) ? v : null;
    });
    return y;
  });
  return [t, ...ys];
}

/**
 * Left edge of a page's shared time axis: `range` seconds before `end`, or where the data starts
 * when that is later (a fresh process), but never less than a minute.
 */
export function rangeStart(end, range, timeArrays) {
  let first = Infinity;
  for (const t of timeArrays) if (t?.length && t[0] < first) first = t[0];
  return Math.max(end - range, Math.min(first, end - 60));
}

/** Time ticks in the browser's time zone: HH:MM, with seconds when ticks are under a minute apart. */
function timeTicks(u, splits, axisIdx, space, incr) {
  const opts = incr < 60 ? { hour: '2-digit', minute: '2-digit', second: '2-digit' } : { hour: '2-digit', minute: '2-digit' };
  return splits.map((v) => new Date(v * 1000).toLocaleTimeString([], opts));
}

/** Units the tick values already carry (ms, GiB, %) need no axis label; others name the unit. */
function axisLabel(unit) {
  return ['seconds', 'bytes', 'ratio'].includes(unit) ? '' : unit;
}

/** y range starting at zero with some headroom; ratios stay within 0–100 %. */
function yRange(unit) {
  return (u, min, max) => {
    const top = isNum(max) && max > 0 ? max : 0;
    if (unit === 'ratio') return [0, Math.max(top > 0.2 ? 1 : 0.2, top * 1.05)];
    return [0, top > 0 ? top * 1.12 : 1];
  };
}

/** Vertical dashed lines at given times (alert onsets), labelled at the top of the plot. */
function markersPlugin(getMarkers) {
  return {
    hooks: {
      draw: [
        (u) => {
          const markers = getMarkers?.() ?? [];
          if (!markers.length) return;
          const { ctx } = u;
          const { left, top, width, height } = u.bbox;
          const dpr = window.devicePixelRatio || 1;
          ctx.save();
          ctx.font = `${11 * dpr}px system-ui, sans-serif`;
          ctx.textAlign = 'left';
          for (const m of markers) {
            const x = Math.round(u.valToPos(m.t, 'x', true));
            if (x < left || x > left + width) continue;
            ctx.strokeStyle = m.color;
            ctx.fillStyle = m.color;
            ctx.lineWidth = 1.5 * dpr;
            ctx.setLineDash([4 * dpr, 3 * dpr]);
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
            if (m.label) {
              // Right of the line, or left of it where the plot ends.
              const tw = ctx.measureText(m.label).width;
              const tx = x + 3 * dpr + tw > left + width ? x - 3 * dpr - tw : x + 3 * dpr;
              ctx.fillText(m.label, tx, top + 11 * dpr);
            }
          }
          ctx.restore();
        },
      ],
    },
  };
}

export const VERSION_MARKER_COLOR = '#7c3aed';
/** How far back version markers are fetched, and how often (every time chart shares them). */
const VERSION_MARKERS_SINCE = '7d';
const VERSION_MARKERS_EVERY_MS = 30_000;
const versionMarkers = { list: [], fetchedAt: 0, inflight: null, timer: null, charts: new Set() };

/** Text drawn at a version marker's line: `model v1→v2`, or the kind and note of a deploy. */
export function versionMarkerLabel(m) {
  const change = m.to_version ? `${m.from_version ? `${m.from_version}→` : ''}${m.to_version}` : m.note;
  const what = m.kind === 'model_version' || m.kind === 'prompt_version' ? m.kind.replace('_version', '') : m.kind;
  return [what, change].filter(Boolean).join(' ').slice(0, 48);
}

/** Fetch the markers (GET /api/v1/markers) unless fetched within `maxAgeMs`; redraw every time chart. */
function refreshVersionMarkers(maxAgeMs) {
  if (versionMarkers.inflight || Date.now() - versionMarkers.fetchedAt < maxAgeMs) return;
  versionMarkers.inflight = getJSON('/api/v1/markers', { since: VERSION_MARKERS_SINCE })
    .then((body) => {
      versionMarkers.list = (body?.markers ?? []).map((m) => ({ ...m, t: m.at_unix_ms / 1000, label: versionMarkerLabel(m) }));
      versionMarkers.fetchedAt = Date.now();
      for (const c of versionMarkers.charts) c.redraw();
    })
    .catch(() => { versionMarkers.fetchedAt = Date.now(); })
    .finally(() => { versionMarkers.inflight = null; });
}

/** Solid lines at version/deploy markers, labelled at the bottom of the plot; the panel's
 * `data-version-markers` counts those drawn and `data-version-marker-labels` joins their labels. */
function versionMarkersPlugin(chart) {
  return {
    hooks: {
      draw: [
        (u) => {
          const { ctx } = u;
          const { left, top, width, height } = u.bbox;
          const dpr = window.devicePixelRatio || 1;
          const drawn = [];
          ctx.save();
          ctx.font = `${10 * dpr}px system-ui, sans-serif`;
          ctx.textAlign = 'left';
          ctx.setLineDash([]);
          ctx.strokeStyle = VERSION_MARKER_COLOR;
          ctx.fillStyle = VERSION_MARKER_COLOR;
          ctx.lineWidth = 1.5 * dpr;
          for (const m of versionMarkers.list) {
            if (chart.opts.model && m.model && m.model !== chart.opts.model) continue;
            const x = Math.round(u.valToPos(m.t, 'x', true));
            if (!Number.isFinite(x) || x < left || x > left + width) continue;
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
            const label = chart.opts.model || !m.model ? m.label : `${m.model} ${m.label}`;
            const tw = ctx.measureText(label).width;
            const tx = x + 3 * dpr + tw > left + width ? x - 3 * dpr - tw : x + 3 * dpr;
            ctx.fillText(label, tx, top + height - 4 * dpr);
            drawn.push(label);
          }
          ctx.restore();
          chart.el.dataset.versionMarkers = String(drawn.length);
          chart.el.dataset.versionMarkerLabels = drawn.join(' | ');
        },
      ],
    },
  };
}

/**
 * One panel: title + uPlot chart over time. `xRange()` returns [min, max] unix seconds so every
 * panel of a page shares one time axis; `sync` links their cursors. Time axes also show the
 * version and deploy markers (of `model` and of the whole fleet when `model` is given).
 */
export class TimeChart {
  constructor(host, { title, unit, sync, xRange, markers, height = 160, id, xUnit, bars = false, model }) {
    this.unit = unit;
    this.opts = { sync, xRange, markers, height, xUnit, bars, model };
    this.plotEl = h('div', { class: 'plot' });
    this.emptyEl = h('div', { class: 'empty' }, 'no data in this range yet');
    this.el = h('section', { class: 'panel', dataset: { chart: id ?? title, points: '0' } },
      h('h3', {}, title), this.plotEl, this.emptyEl);
    host.append(this.el);
    this.u = null;
    this.signature = null;
    this.resize = new ResizeObserver(() => {
      const w = this.plotEl.clientWidth;
      if (this.u && w > 0 && w !== this.u.width) this.u.setSize({ width: w, height: this.opts.height });
    });
    this.resize.observe(this.plotEl);
    if (!xUnit) {
      versionMarkers.charts.add(this);
      refreshVersionMarkers(5_000);
      versionMarkers.timer ??= setInterval(() => {
        if (versionMarkers.charts.size) refreshVersionMarkers(VERSION_MARKERS_EVERY_MS - 1_000);
      }, VERSION_MARKERS_EVERY_MS);
    }
  }

  /** series: [{label, color?, dash?, width?}] matching data [t, ...ys]. */
  setData(series, data) {
    const signature = series.map((s) => `${s.label}|${s.dash ?? ''}`).join('\n');
    if (signature !== this.signature || !this.u) {
      this.u?.destroy();
      this.u = new uPlot(this.options(series), data, this.plotEl);
      this.signature = signature;
    } else {
      this.u.setData(data);
    }
    const points = countPoints(data);
    this.el.dataset.points = String(points);
    this.emptyEl.hidden = points > 0;
  }

  /** Redraw without new data (markers changed). */
  redraw() {
    this.u?.redraw(false, false);
  }

  options(series) {
    const fmt = byUnit(this.unit);
    const { sync, xRange, markers, height, xUnit, bars } = this.opts;
    const xFmt = xUnit ? byUnit(xUnit) : (v) => new Date(v * 1000).toLocaleTimeString();
    return {
      width: this.plotEl.clientWidth || 600,
      height,
      cursor: sync ? { sync: { key: sync, setSeries: false }, drag: { x: false, y: false } } : { drag: { x: false, y: false } },
      legend: { show: series.length <= 16, live: true },
      scales: {
        x: { time: !xUnit, range: (u, min, max) => (xRange ? xRange() : [min, max]) },
        y: { range: yRange(this.unit) },
      },
      series: [
        { value: (u, v) => (v == null ? '' : xFmt(v)) },
        ...series.map((s, i) => defined({
          label: s.label,
          stroke: s.color ?? PALETTE[i % PALETTE.length],
          width: s.width ?? 1.5,
          dash: s.dash,
          spanGaps: !bars,
          points: { show: false },
          fill: bars ? `${s.color ?? PALETTE[i % PALETTE.length]}99` : undefined,
          paths: bars ? uPlot.paths.bars({ size: [0.9, 6] }) : undefined,
          value: (u, v) => fmt(v),
        })),
      ],
      axes: [
        { stroke: '#475569', grid: { stroke: '#e2e8f0' }, ticks: { stroke: '#cbd5e1' }, space: 60, values: xUnit ? axisValues(xUnit) : timeTicks },
        defined({
          stroke: '#475569', size: 66, values: axisValues(this.unit), incrs: this.unit === 'bytes' ? BYTE_INCRS : undefined, grid: { stroke: '#e2e8f0' }, ticks: { stroke: '#cbd5e1' },
          // Same label room on every chart so the plots of a page line up under each other.
          label: axisLabel(this.unit), labelSize: 16, labelFont: '11px system-ui, sans-serif', labelGap: 0,
        }),
      ],
      plugins: xUnit ? [markersPlugin(markers)] : [markersPlugin(markers), versionMarkersPlugin(this)],
    };
  }

  destroy() {
    versionMarkers.charts.delete(this);
    this.resize.disconnect();
    this.u?.destroy();
    this.u = null;
    this.el.remove();
  }
}

export const SPARK_W = 80;
export const SPARK_H = 26;

/**
 * A tiny line on a canvas (fleet table cells); no axes, redrawn in place each poll. The size is
 * fixed (never read from layout), so a thousand rows redraw without forcing a layout each.
 */
export function drawSparkline(canvas, values, { color = PALETTE[0], unit } = {}) {
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== SPARK_W * dpr || canvas.height !== SPARK_H * dpr) {
    canvas.width = SPARK_W * dpr;
    canvas.height = SPARK_H * dpr;
    canvas.style.width = `${SPARK_W}px`;
    canvas.style.height = `${SPARK_H}px`;
  }
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const vals = values ?? [];
  const finite = vals.filter(isNum);
  canvas.dataset.points = String(finite.length);
  if (!finite.length) return;
  const max = unit === 'ratio' ? Math.max(1, ...finite) : Math.max(...finite);
  const min = 0;
  const span = max - min || 1;
  const step = vals.length > 1 ? (canvas.width - 2 * dpr) / (vals.length - 1) : 0;
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5 * dpr;
  ctx.beginPath();
  let pen = false;
  vals.forEach((v, i) => {
    if (!isNum(v)) {
      pen = false;
      return;
    }
    const x = dpr + i * step;
    const y = canvas.height - dpr - ((v - min) / span) * (canvas.height - 2 * dpr);
    if (pen) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
    pen = true;
  });
  ctx.stroke();
}
