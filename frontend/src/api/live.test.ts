import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { LiveConnection } from "./live";

class FakeSocket {
  static OPEN = 1;
  static all: FakeSocket[] = [];
  readyState = 0;
  sent: unknown[] = [];
  onopen: (() => void) | null = null;
  onmessage: ((e: { data: string }) => void) | null = null;
  onclose: (() => void) | null = null;
  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close() {
    this.readyState = 3;
    this.onclose?.();
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

  it("stops reconnecting when stopped", () => {
    const live = new LiveConnection();
    live.start();
    FakeSocket.all[0]!.open();
    live.stop();
    vi.advanceTimersByTime(60_000);
    expect(FakeSocket.all).toHaveLength(1);
  });
});
