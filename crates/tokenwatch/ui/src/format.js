// Number, unit and time formatting shared by tables and chart axes: seconds as ms when small,
// bytes as GiB/MiB, ratios as %, rates with their unit; times in the browser's time zone.

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;
export const DASH = '–';

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

function trim(x, digits) {
  return x.toFixed(digits).replace(/\.0+$/, '').replace(/(\.\d*?)0+$/, '$1');
}

export function seconds(v) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a === 0) return '0 ms';
  if (a < 0.01) return `${trim(v * 1000, 2)} ms`;
  if (a < 1) return `${trim(v * 1000, a < 0.1 ? 1 : 0)} ms`;
  if (a < 120) return `${trim(v, 2)} s`;
  return `${trim(v / 60, 1)} min`;
}

export function bytes(v) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a >= GIB) return `${trim(v / GIB, a >= 100 * GIB ? 0 : 1)} GiB`;
  if (a >= MIB) return `${trim(v / MIB, 0)} MiB`;
  return `${trim(v / 1024, 0)} KiB`;
}

export function ratio(v) {
  if (!isNum(v)) return DASH;
  const p = v * 100;
  return `${trim(p, Math.abs(p) < 10 && p !== 0 ? 1 : 0)} %`;
}

export function num(v, digits = 1) {
  if (!isNum(v)) return DASH;
  const a = Math.abs(v);
  if (a >= 1e6) return `${trim(v / 1e6, 1)} M`;
  if (a >= 1e4) return `${trim(v / 1e3, 1)} k`;
  if (a >= 100) return trim(v, 0);
  return trim(v, digits);
}

export function duration(s) {
  if (!isNum(s)) return DASH;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

/** Formatter for a unit name as the API spells it (`seconds`, `bytes`, `ratio`, `tokens/s`…). */
export function byUnit(unit) {
  switch (unit) {
    case 'seconds': return seconds;
    case 'bytes': return bytes;
    case 'ratio': return ratio;
    case 'celsius': return (v) => (isNum(v) ? `${num(v, 0)} °C` : DASH);
    case 'watts': return (v) => (isNum(v) ? `${num(v, 0)} W` : DASH);
    case undefined: case null: case '': return (v) => num(v);
    default: return (v) => (isNum(v) ? `${num(v)} ${unit}` : DASH);
  }
}

/**
 * uPlot axis `values` callback. Seconds, bytes and ratios carry their unit on every tick (one unit
 * per axis: ms below 1 s, GiB from 1 GiB); other units are plain numbers under an axis label.
 */
export function axisValues(unit) {
  if (unit === 'seconds') {
    return (u, splits) => {
      const max = Math.max(...splits.map((s) => Math.abs(s ?? 0)));
      return splits.map((s) => (s == null ? '' : max < 1 ? `${trim(s * 1000, max < 0.01 ? 2 : max < 0.1 ? 1 : 0)} ms` : `${trim(s, 2)} s`));
    };
  }
  if (unit === 'bytes') {
    return (u, splits) => {
      const max = Math.max(...splits.map((s) => Math.abs(s ?? 0)));
      return splits.map((s) => (s == null ? '' : max >= GIB ? `${trim(s / GIB, 1)} GiB` : `${trim(s / MIB, 0)} MiB`));
    };
  }
  if (unit === 'ratio') return (u, splits) => splits.map((s) => (s == null ? '' : ratio(s)));
  // Other units are named by the axis label; ticks are plain numbers.
  return (u, splits) => splits.map((s) => (s == null ? '' : num(s, 2)));
}

export function timeOfDay(ms) {
  if (!isNum(ms)) return DASH;
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/** Time of day with milliseconds (span and log times), in the browser's time zone. */
export function clockMs(ms) {
  if (!isNum(ms)) return DASH;
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', fractionalSecondDigits: 3 });
}

/** A signed relative change as a percentage: +12 %, −3.4 %. */
export function change(v) {
  if (!isNum(v)) return DASH;
  const p = v * 100;
  const digits = Math.abs(p) < 10 ? 1 : 0;
  const s = trim(Math.abs(p), digits);
  if (s === '0') return '±0 %';
  return `${p > 0 ? '+' : '−'}${s} %`;
}

export function dateTime(ms) {
  if (!isNum(ms)) return DASH;
  return new Date(ms).toLocaleString([], { dateStyle: 'short', timeStyle: 'medium' });
}

export function ago(ms, now = Date.now()) {
  if (!isNum(ms)) return DASH;
  return `${duration(Math.max(0, (now - ms) / 1000))} ago`;
}

/** Format an evidence value by the naming convention of its key (`_s`, `_bytes`, `_unix_ms`…). */
export function evidenceValue(key, v) {
  if (v === null || v === undefined) return DASH;
  if (typeof v === 'boolean') return v ? 'yes' : 'no';
  if (typeof v === 'string') return v;
  if (!isNum(v)) return JSON.stringify(v);
  if (key.endsWith('_unix_ms')) return dateTime(v);
  if (key.endsWith('bytes_per_s')) return `${bytes(v)}/s (${bytes(v * 60)}/min)`;
  if (key.endsWith('_bytes')) return bytes(v);
  if (key.endsWith('_s') || key.endsWith('_seconds')) return seconds(v);
  if (key.endsWith('_ms')) return seconds(v / 1000);
  if (key.includes('ratio') || key.includes('utilization') || key.includes('usage') || key.endsWith('_rate')) return ratio(v);
  return num(v, 3);
}
