// DOM helpers: elements are built with textContent only (never innerHTML), since every string
// shown comes from the API — model names, tenants, alert text.

/**
 * h('a', {href: '#/', class: 'x', onclick: fn, dataset: {k: 'v'}}, 'text', childNode, …)
 * Null, undefined and false children are skipped; arrays are flattened.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/** Set text only when it changed (keeps the DOM quiet on every poll). */
export function setText(el, text) {
  const s = String(text);
  if (el.textContent !== s) el.textContent = s;
}

export function badge(severity, text = severity) {
  return h('span', { class: `badge sev-${severity ?? 'none'}` }, text ?? 'ok');
}

export function stateBadge(state) {
  return h('span', { class: `badge state-${state}` }, state);
}

/** `#/model/NAME` — model ids may contain `/`, so they are URI-encoded into the hash. */
export function modelHref(model, query = '') {
  return `#/model/${encodeURIComponent(model)}${query ? `?${query}` : ''}`;
}

/** A small "label: value" table from pairs, values already formatted (strings or nodes). */
export function kvTable(pairs, cls = 'kv') {
  return h('table', { class: cls }, h('tbody', {}, pairs.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v)))));
}
