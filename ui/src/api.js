// JSON API client for the pages: one GET helper that drops empty parameters, honours the
// page's AbortSignal and turns an error body ({"error": "..."}) into a readable Error.

export class ApiError extends Error {
  constructor(path, status, message) {
    super(`${path}: ${status ? `HTTP ${status}: ` : ''}${message}`);
    this.status = status;
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
    resp = await fetch(url, { signal, headers: { accept: 'application/json' } });
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
  if (!resp.ok) throw new ApiError(path, resp.status, body?.error ?? resp.statusText);
  return body;
}
