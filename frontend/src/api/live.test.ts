import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { LiveConnection } from "./live";

class FakeSocket {
  static OPEN = 1;
  static all: FakeSocket[] = [];
  readyState = 0;
  sent: unknown[] = [];
  onopen: (() => void) | null = null;
  onmessage: ((e: { data: string }) => void) | null = null;
  onclose: ((e?: { code: number }) => void) | null = null;
  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close(code?: number) {
    this.readyState = 3;
    this.onclose?.(code === undefined ? undefined : { code });
  }
  open() {
    this.readyState = FakeSocket.OPEN;
    this.onopen?.();
  }
}

describe("live connection", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    FakeSocket.all = [];
    vi.stubGlobal("window", { location: { protocol: "http:", host: "portal.test" } });
    vi.stubGlobal("WebSocket", FakeSocket);
  });
  afterEach(() => {
    vi.useRealTimers();
    vi.unstubAllGlobals();
  });

  it("subscribes again after a reconnect and reports each confirmation for a resync", () => {
    const live = new LiveConnection();
    const resync = vi.fn();
    const messages: unknown[] = [];
    live.onSubscribed(resync);
    live.onMessage((m) => messages.push(m));
    live.subscribe("jobs");
    live.subscribe("job:7");
    live.start();

    const first = FakeSocket.all[0]!;
    expect(first.url).toBe("ws://portal.test/ws/live/");
    first.open();
    expect(first.sent).toEqual([{ subscribe: "jobs" }, { subscribe: "job", id: 7 }]);
    expect(live.status).toBe("live");

    first.onmessage?.({ data: JSON.stringify({ subscribed: "jobs", id: null }) });
    first.onmessage?.({ data: JSON.stringify({ subscribed: "job", id: 7 }) });
    expect(resync.mock.calls).toEqual([["jobs"], ["job:7"]]);
    first.onmessage?.({ data: JSON.stringify({ kind: "job", job: 7, state: "running" }) });
    expect(messages).toEqual([{ kind: "job", job: 7, state: "running" }]);

    first.close();
    expect(live.status).toBe("offline");
    vi.advanceTimersByTime(20_000);
    const second = FakeSocket.all[1]!;
    second.open();
    expect(second.sent).toEqual([{ subscribe: "jobs" }, { subscribe: "job", id: 7 }]);
    second.onmessage?.({ data: JSON.stringify({ subscribed: "job", id: 7 }) });
    expect(resync).toHaveBeenCalledTimes(3);
  });

  it("reports a socket closed for access, or refused before it opened, so the session is checked", () => {
    const live = new LiveConnection();
    const refused = vi.fn();
    live.onRefused(refused);
    live.start();
    const first = FakeSocket.all[0]!;
    first.open();
    first.close(1006); // a dropped connection: not about the session
    expect(refused).not.toHaveBeenCalled();
    vi.advanceTimersByTime(20_000);
    const second = FakeSocket.all[1]!;
    second.open();
    second.close(4403); // signed out in another tab
    expect(refused).toHaveBeenCalledTimes(1);
    vi.advanceTimersByTime(20_000);
    FakeSocket.all[2]!.close(1006); // the handshake refused with 403: it never opened
    expect(refused).toHaveBeenCalledTimes(2);
    live.stop(); // signed out: no more sockets
    vi.advanceTimersByTime(60_000);
    expect(FakeSocket.all).toHaveLength(3);
  });

  it("stops reconnecting when stopped", () => {
    const live = new LiveConnection();
    live.start();
    FakeSocket.all[0]!.open();
    live.stop();
    vi.advanceTimersByTime(60_000);
    expect(FakeSocket.all).toHaveLength(1);
  });
});

/** A socket that answers as the portal's LiveConsumer does: at most 50 subscriptions per connection. */
class LimitedSocket extends FakeSocket {
  joined = new Set<string>();
  override send(data: string) {
    super.send(data);
    const m = JSON.parse(data) as { subscribe: string; id?: number };
    const group = m.subscribe === "jobs" ? "tenant-1" : `job-${m.id}`;
    queueMicrotask(() => {
      if (this.joined.size + 1 > 50) {
        this.onmessage?.({ data: JSON.stringify({ error: "at most 50 subscriptions per connection" }) });
        return;
      }
      this.joined.add(group);
      this.onmessage?.({ data: JSON.stringify({ subscribed: m.subscribe, id: m.id ?? null }) });
    });
  }
}

describe("the server's subscription limit", () => {
  beforeEach(() => {
    FakeSocket.all = [];
    vi.stubGlobal("window", { location: { protocol: "http:", host: "portal.test" } });
    vi.stubGlobal("WebSocket", LimitedSocket);
  });
  afterEach(() => vi.unstubAllGlobals());

  const settle = async () => {
    for (let i = 0; i < 5; i++) await Promise.resolve();
  };

  it("a job page opened after 50 others in the tab is still followed", async () => {
    const live = new LiveConnection();
    const confirmed: string[] = [];
    live.onSubscribed((t) => confirmed.push(t));
    live.start();
    FakeSocket.all[0]!.open();
    const offJobs = live.subscribe("jobs"); // the job list, left
    await settle();
    offJobs();
    for (let id = 1; id <= 49; id++) {
      const off = live.subscribe(`job:${id}`); // 49 job pages visited, each left
      await settle();
      off();
    }
    live.subscribe("job:50"); // the job page open now: the 51st subscription on the socket
    await settle();

    // The full socket is replaced by one that carries only the topic in use.
    expect(FakeSocket.all).toHaveLength(2);
    expect(FakeSocket.all[0]!.readyState).toBe(3);
    const second = FakeSocket.all[1]!;
    second.open();
    await settle();
    expect(second.sent).toEqual([{ subscribe: "job", id: 50 }]);
    expect(confirmed.at(-1)).toBe("job:50");
    expect(live.status).toBe("live");
  });

  it("keeps the socket when every topic on it is in use", async () => {
    const live = new LiveConnection();
    live.start();
    FakeSocket.all[0]!.open();
    for (let id = 1; id <= 51; id++) live.subscribe(`job:${id}`);
    await settle();
    expect(FakeSocket.all).toHaveLength(1);
    expect(live.status).toBe("live");
  });
});
