// Category bar chart on a canvas (one bar per group, e.g. P99 per A/B arm): y ticks carry their
// unit, values on the bars, an optional dashed threshold line; setData redraws the same canvas.

import { h } from './dom.js';
import { axisValues, byUnit } from './format.js';
import { PALETTE } from './charts.js';

const PAD = { left: 64, right: 12, top: 26, bottom: 30 };
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

/** Ticks from 0 at a 1, 2, 2.5 or 5 × 10^k step, about `n` of them up to `max`. */
function ticks(max, n = 4) {
  const raw = max / n;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * pow).find((s) => s >= raw);
  const out = [];
  for (let t = 0; t <= max * (1 + 1e-9); t += step) out.push(t);
  return out;
}

function fit(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let s = text;
  while (s.length > 1 && ctx.measureText(`${s}…`).width > width) s = s.slice(0, -1);
  return `${s}…`;
}

export class BarChart {
  constructor(host, { id, title, unit, height = 190 }) {
    this.unit = unit;
    this.height = height;
    this.bars = [];
    this.threshold = null;
    this.canvas = h('canvas', { class: 'bars' });
    this.emptyEl = h('div', { class: 'empty' }, 'no data in this window yet');
    this.el = h('section', { class: 'panel', dataset: { chart: id ?? title, points: '0' } }, h('h3', {}, title), this.canvas, this.emptyEl);
    host.append(this.el);
    this.resize = new ResizeObserver(() => this.draw());
    this.resize.observe(this.canvas);
  }

  /** bars: [{label, value, color?, hot?}]; threshold: {value, label} or null. */
  setData(bars, threshold = null) {
    this.bars = bars;
    this.threshold = threshold && isNum(threshold.value) ? threshold : null;
    const points = bars.filter((b) => isNum(b.value)).length;
    this.el.dataset.points = String(points);
    this.emptyEl.hidden = points > 0;
    this.draw();
  }

  draw() {
    const dpr = window.devicePixelRatio || 1;
    const w = this.canvas.clientWidth || 300;
    const hgt = this.height;
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(hgt * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(hgt * dpr);
      this.canvas.style.height = `${hgt}px`;
    }
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    const values = this.bars.map((b) => b.value).filter(isNum);
    if (!values.length) return;
    const fmt = byUnit(this.unit);
    const top = Math.max(...values, this.threshold?.value ?? 0) * 1.15 || 1;
    const ys = ticks(top);
    const max = Math.max(top, ys.at(-1));
    const plotW = w - PAD.left - PAD.right;
    const plotH = hgt - PAD.top - PAD.bottom;
    const y = (v) => PAD.top + plotH - (v / max) * plotH;
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    // Grid and y ticks (units on every tick).
    const labels = axisValues(this.unit)(null, ys);
    ys.forEach((t, i) => {
      ctx.strokeStyle = '#e2e8f0';
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(PAD.left, Math.round(y(t)) + 0.5);
      ctx.lineTo(PAD.left + plotW, Math.round(y(t)) + 0.5);
      ctx.stroke();
      ctx.fillStyle = '#475569';
      ctx.textAlign = 'right';
      ctx.fillText(labels[i], PAD.left - 6, y(t));
    });
    // The threshold first, so the bars and their values draw over it.
    if (this.threshold) {
      const ty = Math.round(y(this.threshold.value)) + 0.5;
      ctx.strokeStyle = '#dc2626';
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(PAD.left, ty);
      ctx.lineTo(PAD.left + plotW, ty);
      ctx.stroke();
      // Its key above the plot, right-aligned, clear of the bars' value labels.
      ctx.textAlign = 'right';
      ctx.textBaseline = 'middle';
      const tw = ctx.measureText(this.threshold.label).width;
      const kx = PAD.left + plotW - tw - 6;
      ctx.beginPath();
      ctx.moveTo(kx - 22, 9.5);
      ctx.lineTo(kx, 9.5);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = '#dc2626';
      ctx.fillText(this.threshold.label, PAD.left + plotW, 10);
    }
    // Bars, their values above and their group below.
    const slot = plotW / this.bars.length;
    const bw = Math.min(slot * 0.6, 90);
    this.bars.forEach((b, i) => {
      const cx = PAD.left + slot * (i + 0.5);
      ctx.textAlign = 'center';
      ctx.fillStyle = '#334155';
      ctx.textBaseline = 'top';
      ctx.fillText(fit(ctx, b.label, slot - 4), cx, PAD.top + plotH + 8);
      if (!isNum(b.value)) return;
      ctx.fillStyle = b.color ?? PALETTE[i % PALETTE.length];
      ctx.fillRect(cx - bw / 2, y(b.value), bw, y(0) - y(b.value));
      if (b.hot) {
        ctx.strokeStyle = '#dc2626';
        ctx.lineWidth = 2;
        ctx.strokeRect(cx - bw / 2 + 1, y(b.value) + 1, bw - 2, y(0) - y(b.value) - 1);
      }
      // The value on a white ground, readable over the threshold line.
      const text = fmt(b.value);
      const tw = ctx.measureText(text).width;
      ctx.fillStyle = '#fff';
      ctx.fillRect(cx - tw / 2 - 2, y(b.value) - 16, tw + 4, 13);
      ctx.fillStyle = b.hot ? '#dc2626' : '#0f172a';
      ctx.textBaseline = 'bottom';
      ctx.fillText(text, cx, y(b.value) - 3);
    });
  }


  destroy() {
    this.resize.disconnect();
    this.el.remove();
  }
}
