// JSON API client for the pages: one GET helper that drops empty parameters, honours the
// page's AbortSignal and turns an error body ({"error": "..."}) into a readable Error. When
// tokenwatch has tokens (auth.tokens_file) it asks once for one and sends it on every call.

import { h } from './dom.js';

const TOKEN_KEY = 'tokenwatch.token';
let asking = null; // the one pending token form, shared by every call that got a 401

export class ApiError extends Error {
  constructor(path, status, message) {
    super(`${path}: ${status ? `HTTP ${status}: ` : ''}${message}`);
    this.status = status;
  }
}

function storedToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** Headers for a fetch: `extra` plus the session's bearer token, if one was given. */
export function authHeaders(extra = {}) {
  const token = storedToken();
  return token ? { ...extra, authorization: `Bearer ${token}` } : extra;
}

/** Show the token form (once, however many calls wait) and resolve with the token entered. */
function askToken(why) {
  if (!asking) {
    asking = new Promise((resolve) => {
      const input = h('input', { type: 'password', id: 'auth-token', autocomplete: 'off', required: true, placeholder: 'token' });
      const form = h('form', { class: 'auth-form', id: 'auth-form' },
        h('h2', {}, 'tokenwatch needs a token'),
        h('p', { class: 'muted' }, why),
        input, ' ', h('button', { type: 'submit' }, 'use token'));
      form.addEventListener('submit', (e) => {
        e.preventDefault();
        const token = input.value.trim();
        if (!token) return;
        try {
          sessionStorage.setItem(TOKEN_KEY, token);
        } catch { /* storage off: the token lasts until reload */ }
        form.remove();
        asking = null;
        resolve(token);
      });
      document.body.append(form);
      input.focus();
    });
  }
  return asking;
}

/** Resolve with the next token entered, or reject when the page's call is aborted. */
function waitForToken(why, signal) {
  const given = askToken(why);
  if (!signal) return given;
  return new Promise((resolve, reject) => {
    const abort = () => reject(new DOMException('aborted', 'AbortError'));
    if (signal.aborted) return abort();
    signal.addEventListener('abort', abort, { once: true });
    given.then(resolve);
  });
}

/**
 * fetch with the session's token; on 401 (and on 403, a token of the wrong role) the stored
 * token is dropped and the form asks for one, then the call is made again.
 */
export async function authFetch(url, init = {}) {
  for (;;) {
    const sent = storedToken();
    const resp = await fetch(url, { ...init, headers: authHeaders(init.headers ?? {}) });
    if (resp.status !== 401 && !(resp.status === 403 && sent)) return resp;
    let why = 'Paste a token with the read role (see auth.tokens_file); it is kept for this browser tab only.';
    if (sent) {
      if (storedToken() === sent) sessionStorage.removeItem(TOKEN_KEY);
      const body = await resp.json().catch(() => null);
      why = `That token was refused: ${body?.error?.message ?? `HTTP ${resp.status}`}`;
    }
    await waitForToken(why, init.signal);
  }
}

export async function getJSON(path, params = {}, signal = undefined) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const url = q.size ? `${path}?${q}` : path;
  let resp;
  try {
    resp = await authFetch(url, { signal, headers: { accept: 'application/json' } });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(path, 0, 'tokenwatch is not reachable');
  }
  const text = await resp.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    throw new ApiError(path, resp.status, 'answer is not JSON');
  }
  const error = body?.error;
  if (!resp.ok) throw new ApiError(path, resp.status, error?.message ?? error ?? resp.statusText);
  return body;
}

/** A link cannot carry the bearer token: with one in the session, a click fetches and saves the file. */
export function tokenDownload(e) {
  const link = e.currentTarget;
  if (!storedToken()) return;
  e.preventDefault();
  authFetch(link.href)
    .then(async (resp) => {
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const url = URL.createObjectURL(await resp.blob());
      h('a', { href: url, download: link.getAttribute('download') ?? '' }).click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    })
    .catch((err) => {
      link.title = `download failed: ${err.message}`;
    });
}
