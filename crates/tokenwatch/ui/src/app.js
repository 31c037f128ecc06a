// The page shell: hash routing to the pages, one poll loop (every 2 s, paused while the tab is
// hidden) that refreshes the current page in place, and the header's alert count and status.

import { getJSON } from './api.js';
import { setText } from './dom.js';
import { timeOfDay } from './format.js';
import fleet from './pages/fleet.js';
import model from './pages/model.js';
import alerts from './pages/alerts.js';
import alertDetail from './pages/alert.js';
import requests from './pages/requests.js';
import requestTimeline from './pages/request.js';
import gpus from './pages/gpus.js';
import trace from './pages/trace.js';
import compare from './pages/compare.js';
import slos from './pages/slos.js';
import spend from './pages/spend.js';

const POLL_MS = 2000;

const ROUTES = [
  [/^\/?$/, fleet],
  [/^\/model\/(.+)$/, model],
  [/^\/alerts\/?$/, alerts],
  [/^\/alerts\/(.+)$/, alertDetail],
  [/^\/requests\/?$/, requests],
  [/^\/requests\/(.+)$/, requestTimeline],
  [/^\/gpus\/?$/, gpus],
  [/^\/traces\/(.+)$/, trace],
  [/^\/compare\/?$/, compare],
  [/^\/slos\/?$/, slos],
  [/^\/spend\/?$/, spend],
];

const view = document.getElementById('view');
const statusEl = document.getElementById('status');
const navAlerts = document.getElementById('nav-alerts');

/** What tests and curious people can read: ticks done, last error, current page, last tick's ms. */
const probe = { ticks: 0, errors: 0, lastError: null, page: null, lastTickMs: 0 };
window.tokenwatch = probe;

let current = null; // { page, ctx, generation }
let generation = 0;
let inFlight = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, query = ''] = raw.split('?');
  return { path, params: new URLSearchParams(query) };
}

function route() {
  const { path, params } = parseHash();
  for (const [re, page] of ROUTES) {
    const m = path.match(re);
    if (m) return { page, arg: m[1] === undefined ? undefined : decodeURIComponent(m[1]), params };
  }
  return { page: fleet, arg: undefined, params };
}

function mount() {
  if (current) {
    current.ctx.abort.abort();
    current.page.unmount?.();
  }
  generation += 1;
  const { page, arg, params } = route();
  view.replaceChildren();
  document.body.dataset.page = page.name;
  document.body.dataset.ready = '0';
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === page.nav);
  const abort = new AbortController();
  const ctx = {
    arg,
    params,
    signal: abort.signal,
    abort,
    /** Replace the hash's query (e.g. a range selector) and remount. */
    setParams(next) {
      const q = new URLSearchParams(params);
      for (const [k, v] of Object.entries(next)) {
        if (v === '' || v === null || v === undefined) q.delete(k);
        else q.set(k, v);
      }
      const { path } = parseHash();
      location.hash = `#${path}${q.size ? `?${q}` : ''}`;
    },
  };
  current = { page, ctx, generation };
  probe.page = page.name;
  document.title = `tokenwatch · ${page.title ?? page.name}`;
  page.mount(view, ctx);
  tick(true);
}

async function refreshNav(signal) {
  const body = await getJSON('/api/v1/alerts', { state: 'firing' }, signal);
  const n = body?.alerts?.length ?? 0;
  navAlerts.hidden = n === 0;
  setText(navAlerts, n);
  const worst = body?.alerts?.some((a) => a.severity === 'critical') ? 'critical' : 'warning';
  navAlerts.className = `count sev-${worst}`;
}

async function tick(force = false) {
  if (!current || (document.hidden && !force)) return;
  if (inFlight && inFlight.generation === generation && !force) return;
  const mine = { generation: current.generation };
  inFlight = mine;
  const { page, ctx } = current;
  const started = performance.now();
  try {
    await Promise.all([page.refresh?.(ctx), refreshNav(ctx.signal)]);
    if (mine.generation !== generation) return;
    probe.ticks += 1;
    probe.lastTickMs = Math.round(performance.now() - started);
    probe.lastError = null;
    document.body.dataset.ready = '1';
    statusEl.className = 'status ok';
    setText(statusEl, `live · updated ${timeOfDay(Date.now())}`);
  } catch (e) {
    if (e?.name === 'AbortError' || mine.generation !== generation) return;
    probe.errors += 1;
    probe.lastError = String(e?.message ?? e);
    statusEl.className = 'status error';
    setText(statusEl, probe.lastError);
  } finally {
    if (inFlight === mine) inFlight = null;
  }
}

document.addEventListener('visibilitychange', () => {
  if (document.hidden) {
    statusEl.className = 'status paused';
    setText(statusEl, 'paused (tab hidden)');
  } else {
    tick(true);
  }
});
window.addEventListener('hashchange', mount);
setInterval(tick, POLL_MS);
mount();
