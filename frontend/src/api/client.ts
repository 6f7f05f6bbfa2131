// The REST client: same-origin fetch with the session cookie and the CSRF header.

export type FieldErrors = Record<string, string[]>;

export class ApiError extends Error {
  readonly status: number;
  readonly fields: FieldErrors;

  constructor(status: number, message: string, fields: FieldErrors = {}) {
    super(message);
    this.status = status;
    this.fields = fields;
  }
}

/** Flattens DRF errors ({retries: {limit: ["..."]}, mounts: [{path: [...]}]}) into dotted field names. */
export function flattenErrors(body: unknown, prefix = ""): FieldErrors {
  const out: FieldErrors = {};
  const add = (key: string, msg: string) => {
    (out[key] ??= []).push(msg);
  };
  const walk = (value: unknown, key: string) => {
    if (typeof value === "string") add(key || "detail", value);
    else if (Array.isArray(value)) {
      value.forEach((item, i) => {
        if (typeof item === "string") add(key || "detail", item);
        else walk(item, key ? `${key}.${i}` : String(i));
      });
    } else if (value && typeof value === "object") {
      for (const [k, v] of Object.entries(value)) {
        const name = k === "non_field_errors" ? key || "detail" : key ? `${key}.${k}` : k;
        walk(v, name);
      }
    }
  };
  walk(body, prefix);
  return out;
}

/** The words of a refusal for a place without fields: the API's messages, without the internal
 * field names they were filed under (a form that shows the fields reads `ApiError.fields`). */
export function errorMessage(status: number, fields: FieldErrors): string {
  const detail = fields["detail"]?.join(" ");
  if (detail) return detail;
  const messages = Object.values(fields).flat();
  if (messages.length) return messages.join(" ");
  if (status === 0) return "The portal cannot be reached. Check your connection.";
  return `The portal answered ${status}.`;
}

export function csrfToken(): string {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match?.[1] ? decodeURIComponent(match[1]) : "";
}

let onUnauthorized: ((status: 401 | 403) => void) | null = null;
/** `handler` hears of each refused request: 401 (not signed in: the session ended, perhaps in
 * another tab) and 403 (not allowed, or perhaps not signed in: it asks the session to tell). */
export function setUnauthorizedHandler(handler: (status: 401 | 403) => void): void {
  onUnauthorized = handler;
}

export interface RequestOptions {
  method?: string;
  body?: unknown;
  /** Send the body as is with this content type (for YAML). */
  rawBody?: string;
  contentType?: string;
  signal?: AbortSignal;
  /** Do not call the sign-out handler on 401 or 403 (for the session probe). */
  quiet401?: boolean;
}

export async function api<T>(path: string, options: RequestOptions = {}): Promise<T> {
  const method = options.method ?? "GET";
  const headers: Record<string, string> = { Accept: "application/json" };
  let body: string | undefined;
  if (options.rawBody !== undefined) {
    body = options.rawBody;
    headers["Content-Type"] = options.contentType ?? "text/plain";
  } else if (options.body !== undefined) {
    body = JSON.stringify(options.body);
    headers["Content-Type"] = "application/json";
  }
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  let response: Response;
  try {
    response = await fetch(path, { method, headers, body, credentials: "same-origin", signal: options.signal });
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, errorMessage(0, {}));
  }
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  let data: unknown = undefined;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text.slice(0, 300) };
    }
  }
  if (!response.ok) {
    if ((response.status === 401 || response.status === 403) && !options.quiet401) onUnauthorized?.(response.status);
    const fields = flattenErrors(data);
    throw new ApiError(response.status, errorMessage(response.status, fields), fields);
  }
  return data as T;
}

export function query(params: Record<string, string | number | string[] | undefined | null>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => search.append(key, v));
    else search.append(key, String(value));
  }
  const s = search.toString();
  return s ? `?${s}` : "";
}

/** Fetches every page of a paginated list (for small lists such as nodes, flavors and VCs). */
export async function fetchAll<T>(path: string, signal?: AbortSignal): Promise<T[]> {
  const out: T[] = [];
  let url: string | null = path;
  while (url) {
    const page: { results: T[]; next?: string | null } = await api(url, { signal });
    out.push(...page.results);
    if (page.next) {
      const next = new URL(page.next, window.location.origin);
      url = next.pathname + next.search;
    } else url = null;
  }
  return out;
}
