// The dashboard's REST client: the API key from the tab's session storage (never a URL), typed
// errors, and server-sent events read from a fetch stream (EventSource cannot send the key).
const KEY = "pandastack.key";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

export const key = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (k) => sessionStorage.setItem(KEY, k),
  clear: () => sessionStorage.removeItem(KEY),
};

async function request(method, path, { json, body, headers } = {}) {
  const h = { Authorization: `Bearer ${key.get()}`, ...(headers || {}) };
  if (json !== undefined) h["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, { method, headers: h, body: json !== undefined ? JSON.stringify(json) : body });
  } catch (e) {
    throw new ApiError(0, "connection_error", "the daemon cannot be reached");
  }
  if (!res.ok) {
    let code = `http_${res.status}`, message = res.statusText;
    try {
      const j = await res.json();
      if (j.error) ({ code, message } = j.error);
    } catch (_) { /* not JSON */ }
    throw new ApiError(res.status, code, message);
  }
  return res;
}

export const api = {
  request,
  async json(method, path, json) {
    const res = await request(method, path, { json });
    return res.status === 204 ? null : res.json();
  },
  get: (path) => api.json("GET", path),
  post: (path, json) => api.json("POST", path, json ?? {}),
  del: (path) => api.json("DELETE", path),
  async text(path) { return (await request("GET", path)).text(); },
  async blob(path) { return (await request("GET", path)).blob(); },
  async put(path, body) { return request("PUT", path, { body, headers: { "Content-Type": "application/octet-stream" } }); },
  // Server-sent events of `path`: onEvent(event, data) for each; resolves when the stream ends.
  async stream(method, path, json, onEvent, signal) {
    const h = { Authorization: `Bearer ${key.get()}` };
    if (json !== undefined) h["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers: h, body: json !== undefined ? JSON.stringify(json) : undefined, signal });
    if (!res.ok) {
      let code = `http_${res.status}`, message = res.statusText;
      try { ({ code, message } = (await res.json()).error); } catch (_) { /* not JSON */ }
      throw new ApiError(res.status, code, message);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "", event = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) onEvent(event, JSON.parse(line.slice(6)));
      }
    }
  },
};
