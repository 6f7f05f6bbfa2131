// The live socket (/ws/live/): one connection per tab and subscriptions that survive reconnects.
// Whenever the server confirms a subscription (the first time, and again after every reconnect)
// the pages behind it refetch over REST what they may have missed: the resync.
// The server has no unsubscribe and refuses more than 50 subscriptions on one connection, so a
// topic no page uses any more stays joined until the socket closes. When the server refuses a
// subscription for that limit while the socket still carries such stale topics, the connection
// is recycled: a new socket subscribes to the topics in use only.
// A socket the server refuses or closes for access (4401, 4403: signed out, here or in another
// tab, or the sign-in expired), or one that closes before it opened (a refused handshake reads
// so in a browser), is reported to `onRefused` listeners, which ask the portal whether the
// session still holds; reconnecting goes on until they stop the connection.
import { useEffect, useState, useSyncExternalStore } from "react";

import { reconnectDelayMs } from "../lib/backoff";

export interface LiveJobMessage {
  kind: "job";
  job: number;
  state: string;
  pending_reason?: string;
  pending_message?: string;
  version?: number;
}
export interface LiveLogLine {
  replica: number;
  stream: string;
  seq: number;
  text: string;
}
export interface LiveLogMessage {
  kind: "log";
  job: number;
  attempt: number;
  lines: LiveLogLine[];
}
/** A GPU's reading; a metric the device did not report is null (the chart leaves a gap). */
export interface LiveTelemetrySample {
  gpu_uuid: string;
  time: string;
  utilization_pct: number | null;
  memory_used_mib: number | null;
  memory_total_mib?: number | null;
  power_w: number | null;
  temperature_c: number | null;
}
export interface LiveTelemetryMessage {
  kind: "telemetry";
  job: number;
  samples: LiveTelemetrySample[];
}
export type LiveMessage = LiveJobMessage | LiveLogMessage | LiveTelemetryMessage;

export type LiveStatus = "connecting" | "live" | "offline";

/** The URL of one of the portal's sockets (a path such as "/ws/live/") on this page's host. */
export function socketUrl(path: string): string {
  const scheme = window.location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${window.location.host}${path}`;
}

type Topic = string; // "jobs" or "job:<id>"
type Listener = (message: LiveMessage) => void;

/** Whether a message from the server refuses a subscription for the per-connection limit
 * (`{"error": "at most 50 subscriptions per connection"}`; portal/live/consumers.py). */
export function isSubscriptionLimit(message: object): boolean {
  const error = (message as { error?: unknown }).error;
  return typeof error === "string" && error.includes("subscriptions per connection");
}

/** Close codes with which the portal ends a live socket for access: not signed in, or access
 * changed (a sign-out, an expired sign-in, a membership changed). */
const ACCESS_CLOSE_CODES = [4401, 4403];

/** Whether a closed socket may have been refused for the session: closed for access, or before it
 * ever opened (a browser reports a handshake the server refused as 1006, like an unreachable one). */
export function mayBeRefused(code: number | undefined, opened: boolean): boolean {
  return !opened || (code !== undefined && ACCESS_CLOSE_CODES.includes(code));
}

export class LiveConnection {
  private socket: WebSocket | null = null;
  private topics = new Map<Topic, number>(); // reference counts
  private sentOnSocket = new Set<Topic>(); // topics subscribed to on the current socket
  private listeners = new Set<Listener>();
  private subscribedListeners = new Set<(topic: Topic) => void>();
  private statusListeners = new Set<() => void>();
  private refusedListeners = new Set<() => void>();
  private attempt = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private wanted = false;
  status: LiveStatus = "offline";

  start(): void {
    this.wanted = true;
    if (!this.socket && !this.timer) this.connect();
  }

  stop(): void {
    this.wanted = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.socket?.close();
    this.socket = null;
    this.setStatus("offline");
  }

  private setStatus(status: LiveStatus): void {
    if (this.status === status) return;
    this.status = status;
    this.statusListeners.forEach((l) => l());
  }

  private connect(): void {
    this.timer = null;
    let socket: WebSocket;
    try {
      socket = new WebSocket(socketUrl("/ws/live/"));
    } catch {
      this.scheduleReconnect();
      return;
    }
    this.socket = socket;
    this.sentOnSocket = new Set();
    this.setStatus("connecting");
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.attempt = 0;
      this.setStatus("live");
      for (const topic of this.topics.keys()) this.sendSubscribe(topic);
    };
    socket.onmessage = (event) => {
      let message: unknown;
      try {
        message = JSON.parse(String(event.data));
      } catch {
        return;
      }
      if (!message || typeof message !== "object") return;
      if ("kind" in message) this.listeners.forEach((l) => l(message as LiveMessage));
      else if (isSubscriptionLimit(message)) this.recycle(socket);
      else if ("subscribed" in message) {
        const m = message as { subscribed: string; id?: number | null };
        const topic = m.subscribed === "job" ? `job:${m.id}` : m.subscribed;
        this.subscribedListeners.forEach((l) => l(topic));
      }
    };
    socket.onclose = (event?: CloseEvent) => {
      if (this.socket === socket) this.socket = null;
      this.setStatus("offline");
      if (this.wanted) this.scheduleReconnect();
      if (this.wanted && mayBeRefused(event?.code, opened)) this.refusedListeners.forEach((l) => l());
    };
  }

  /** Replaces a socket that reached the server's subscription limit with a new one that subscribes
   * to the topics in use only; nothing to gain (and no loop) when every topic on it is in use. */
  private recycle(socket: WebSocket): void {
    if (this.socket !== socket || !this.wanted) return;
    if ([...this.sentOnSocket].every((topic) => this.topics.has(topic))) return;
    socket.onclose = null;
    socket.onmessage = null;
    socket.close();
    this.socket = null;
    this.connect();
  }

  private scheduleReconnect(): void {
    if (this.timer) return;
    const delay = reconnectDelayMs(this.attempt++);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  private sendSubscribe(topic: Topic): void {
    if (this.socket?.readyState !== WebSocket.OPEN) return;
    const message = topic === "jobs" ? { subscribe: "jobs" } : { subscribe: "job", id: Number(topic.slice(4)) };
    this.sentOnSocket.add(topic);
    this.socket.send(JSON.stringify(message));
  }

  subscribe(topic: Topic): () => void {
    const count = this.topics.get(topic) ?? 0;
    this.topics.set(topic, count + 1);
    if (count === 0) this.sendSubscribe(topic);
    // The server has no unsubscribe; a topic nobody listens to any more is dropped at the next
    // reconnect, or sooner when the server's subscription limit recycles the socket.
    return () => {
      const left = (this.topics.get(topic) ?? 1) - 1;
      if (left <= 0) this.topics.delete(topic);
      else this.topics.set(topic, left);
    };
  }

  onMessage(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Called with the topic each time the server confirms a subscription to it. */
  onSubscribed(listener: (topic: Topic) => void): () => void {
    this.subscribedListeners.add(listener);
    return () => this.subscribedListeners.delete(listener);
  }

  /** Called when a socket may have been refused for the session (see `mayBeRefused`). */
  onRefused(listener: () => void): () => void {
    this.refusedListeners.add(listener);
    return () => this.refusedListeners.delete(listener);
  }

  onStatus(listener: () => void): () => void {
    this.statusListeners.add(listener);
    return () => this.statusListeners.delete(listener);
  }
}

export const live = new LiveConnection();

export function useLiveStatus(): LiveStatus {
  return useSyncExternalStore(
    (cb) => live.onStatus(cb),
    () => live.status,
  );
}

/**
 * Subscribes to a topic while the component is mounted. `onMessage` receives every live message
 * (filter by kind and job); `resync` runs when the server confirms the subscription (so nothing
 * between the first REST load and the subscription is lost, and again after each reconnect) and,
 * while the socket is down, every `pollMs` as the fallback.
 */
export function useLive(
  topic: Topic | null,
  onMessage: (message: LiveMessage) => void,
  resync: () => void,
  pollMs = 10_000,
): LiveStatus {
  const status = useLiveStatus();
  const [handlers] = useState(() => ({ onMessage, resync }));
  handlers.onMessage = onMessage;
  handlers.resync = resync;

  useEffect(() => {
    if (!topic) return;
    const unsubscribe = live.subscribe(topic);
    const offMessage = live.onMessage((m) => handlers.onMessage(m));
    const offResync = live.onSubscribed((t) => t === topic && handlers.resync());
    return () => {
      unsubscribe();
      offMessage();
      offResync();
    };
  }, [topic, handlers]);

  useEffect(() => {
    if (!topic || status === "live") return;
    const id = setInterval(() => handlers.resync(), pollMs);
    return () => clearInterval(id);
  }, [topic, status, pollMs, handlers]);

  return status;
}
