import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { type ShellEnd, ShellSession, describeEnd } from "./shell";

class FakeSocket {
  static all: FakeSocket[] = [];
  readyState = 0;
  sent: unknown[] = [];
  closedWith: number | null = null;
  onopen: (() => void) | null = null;
  onmessage: ((e: { data: string }) => void) | null = null;
  onclose: ((e: { code: number }) => void) | null = null;
  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close(code: number) {
    this.closedWith = code;
    this.readyState = 3;
  }
  open() {
    this.readyState = 1;
    this.onopen?.();
  }
  receive(message: unknown) {
    this.onmessage?.({ data: JSON.stringify(message) });
  }
  serverClose(code: number) {
    this.readyState = 3;
    this.onclose?.({ code });
  }
}

function start(replica = 0) {
  const events: unknown[] = [];
  const session = new ShellSession(12, replica, { cols: 100, rows: 30 }, {
    onOpened: (o) => events.push(["opened", o]),
    onOutput: (d) => events.push(["output", d]),
    onEnded: (e) => events.push(["ended", e]),
    onError: (m) => events.push(["error", m]),
  });
  return { session, events, socket: FakeSocket.all[FakeSocket.all.length - 1]! };
}

function end(partial: Partial<ShellEnd>): ShellEnd {
  return { exitCode: null, reason: "", closeCode: 1000, exited: false, connected: true, opened: true, ...partial };
}

describe("shell session", () => {
  beforeEach(() => {
    FakeSocket.all = [];
    vi.stubGlobal("window", { location: { protocol: "https:", host: "portal.test" } });
    vi.stubGlobal("WebSocket", FakeSocket);
  });
  afterEach(() => vi.unstubAllGlobals());

  it("opens the job's socket with the replica and size, and sends input and resizes once open", () => {
    const { session, events, socket } = start(1);
    expect(socket.url).toBe("wss://portal.test/ws/jobs/12/shell/?replica=1&cols=100&rows=30");
    socket.open();
    session.send("ls\r"); // not open yet: dropped
    expect(socket.sent).toEqual([]);

    socket.receive({ type: "opened", job: 12, replica: 1, node: "gpu-3" });
    expect(events).toEqual([["opened", { node: "gpu-3", replica: 1 }]]);
    expect(socket.sent).toEqual([{ type: "resize", cols: 100, rows: 30 }]);

    session.send("ls\r");
    session.resize(100, 30); // unchanged: not sent again
    session.resize(120, 40);
    socket.receive({ type: "output", data: "\x1b[1mfile\x1b[0m\r\n" });
    expect(socket.sent.slice(1)).toEqual([
      { type: "input", data: "ls\r" },
      { type: "resize", cols: 120, rows: 40 },
    ]);
    expect(events[1]).toEqual(["output", "\x1b[1mfile\x1b[0m\r\n"]);

    socket.receive({ type: "error", error: "input must be 1 to 65536 characters" });
    expect(events[2]).toEqual(["error", "input must be 1 to 65536 characters"]);

    socket.receive({ type: "exit", exit_code: 0, reason: "exited" });
    socket.serverClose(1000);
    expect(events[3]).toEqual(["ended", end({ exitCode: 0, reason: "exited", exited: true })]);
    session.send("more");
    expect(socket.sent).toHaveLength(3);
  });

  it("splits a long paste into frames the server takes", () => {
    const { session, socket } = start();
    socket.open();
    socket.receive({ type: "opened", job: 12, replica: 0, node: "n" });
    session.send("x".repeat(70_000));
    const inputs = socket.sent.filter((m) => (m as { type: string }).type === "input") as { data: string }[];
    expect(inputs.map((m) => m.data.length)).toEqual([65536, 70_000 - 65536]);
  });

  it("reports a refusal with its close code, and nothing after the user closed it", () => {
    const refused = start();
    refused.socket.open();
    refused.socket.receive({ type: "exit", exit_code: null, reason: "replica 1 is not running" });
    refused.socket.serverClose(4409);
    expect(refused.events).toEqual([
      ["ended", end({ closeCode: 4409, reason: "replica 1 is not running", exited: true, opened: false })],
    ]);

    const closed = start();
    closed.socket.open();
    closed.session.close();
    expect(closed.socket.closedWith).toBe(1000);
    closed.socket.serverClose(1000);
    expect(closed.events).toEqual([]);
  });

  it("says in words how a shell ended", () => {
    expect(describeEnd(end({ closeCode: 4401, opened: false })).message).toMatch(/signed out/);
    expect(describeEnd(end({ closeCode: 4403, opened: false })).message).toBe("Only the job's owner can open a shell.");
    expect(describeEnd(end({ closeCode: 4403 })).message).toMatch(/access changed/);
    expect(describeEnd(end({ closeCode: 4404, opened: false })).message).toMatch(/does not exist/);
    expect(describeEnd(end({ closeCode: 4409, exited: true, reason: "the node's agent is not connected" }))).toEqual({
      message: "This job is not running, so it has no shell to open.",
      detail: "the node's agent is not connected",
    });
    expect(describeEnd(end({ closeCode: 4429, opened: false })).message).toBe("Too many shells open; close one first.");
    expect(describeEnd(end({ closeCode: 4504, exited: true })).message).toBe("The job's node did not answer.");
    expect(describeEnd(end({ exited: true, exitCode: 130 })).message).toBe("The shell exited with code 130.");
    expect(describeEnd(end({ exited: true, reason: "idle for 30 minutes" }))).toEqual({
      message: "The shell ended.",
      detail: "idle for 30 minutes",
    });
    expect(describeEnd(end({ closeCode: 1006, connected: false, opened: false })).message).toMatch(/could not be opened/);
    expect(describeEnd(end({ closeCode: 1006 })).message).toBe("The connection to the portal was lost.");
  });
});
