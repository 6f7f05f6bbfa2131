// The shell socket of a running job (/ws/jobs/ID/shell/): one shell in one replica, opened by the
// job's owner with the browser session. The server sends "opened", then "output" frames, then an
// "exit" frame and closes; the browser sends "input" (keystrokes) and "resize" frames. A closed
// session is not reopened on its own: the user reconnects.
import { chunkInput } from "../lib/terminal";
import { socketUrl } from "./live";

export interface ShellOpened {
  node: string;
  replica: number;
}

export interface ShellEnd {
  /** The shell's exit status, when the server sent one. */
  exitCode: number | null;
  /** The server's words for why it ended ("" when it sent none). */
  reason: string;
  /** The socket's close code (1006: cut without one). */
  closeCode: number;
  /** Whether an exit frame came before the close. */
  exited: boolean;
  /** Whether the server accepted the connection at all. */
  connected: boolean;
  /** Whether the shell had opened (an "opened" frame came). */
  opened: boolean;
}

export interface ShellHandlers {
  onOpened: (opened: ShellOpened) => void;
  onOutput: (data: string) => void;
  onEnded: (end: ShellEnd) => void;
  /** An error frame: the server refused a message, the session goes on. */
  onError: (message: string) => void;
}

function shellPath(jobId: number, replica: number, cols: number, rows: number): string {
  return `/ws/jobs/${jobId}/shell/?replica=${replica}&cols=${cols}&rows=${rows}`;
}

export class ShellSession {
  private socket: WebSocket | null = null;
  private connected = false;
  private opened = false;
  private exit: { exitCode: number | null; reason: string } | null = null;
  private done = false;
  private size: { cols: number; rows: number };
  private sentSize = "";

  constructor(
    readonly jobId: number,
    readonly replica: number,
    size: { cols: number; rows: number },
    private readonly handlers: ShellHandlers,
  ) {
    this.size = size;
    let socket: WebSocket;
    try {
      socket = new WebSocket(socketUrl(shellPath(jobId, replica, size.cols, size.rows)));
    } catch {
      this.finish(1006);
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      this.connected = true;
    };
    socket.onmessage = (event) => this.receive(event.data);
    socket.onclose = (event) => this.finish(event.code);
  }

  get isOpen(): boolean {
    return this.opened && !this.done;
  }

  /** Sends keystrokes (or a paste); nothing before the shell is open or after it ended. */
  send(data: string): void {
    if (!this.isOpen || !data) return;
    for (const piece of chunkInput(data)) this.post({ type: "input", data: piece });
  }

  /** The terminal's size; sent once the shell is open, and again whenever it changes. */
  resize(cols: number, rows: number): void {
    this.size = { cols, rows };
    if (!this.isOpen) return;
    const key = `${cols}x${rows}`;
    if (key === this.sentSize) return;
    this.sentSize = key;
    this.post({ type: "resize", cols, rows });
  }

  /** Closes the session without telling the handlers (the user closed it). */
  close(): void {
    this.done = true;
    const socket = this.socket;
    this.socket = null;
    if (socket && socket.readyState <= 1) socket.close(1000);
  }

  private post(message: unknown): void {
    if (this.socket?.readyState === 1) this.socket.send(JSON.stringify(message));
  }

  private receive(data: unknown): void {
    if (this.done) return;
    let message: unknown;
    try {
      message = JSON.parse(String(data));
    } catch {
      return;
    }
    if (!message || typeof message !== "object") return;
    const m = message as Record<string, unknown>;
    if (m.type === "opened") {
      this.opened = true;
      const replica = typeof m.replica === "number" ? m.replica : this.replica;
      this.handlers.onOpened({ node: typeof m.node === "string" ? m.node : "", replica });
      this.resize(this.size.cols, this.size.rows);
    } else if (m.type === "output" && typeof m.data === "string") {
      this.handlers.onOutput(m.data);
    } else if (m.type === "exit") {
      this.exit = {
        exitCode: typeof m.exit_code === "number" ? m.exit_code : null,
        reason: typeof m.reason === "string" ? m.reason : "",
      };
    } else if (m.type === "error") {
      this.handlers.onError(typeof m.error === "string" ? m.error : "The portal refused a message.");
    }
  }

  private finish(closeCode: number): void {
    if (this.done) return;
    this.done = true;
    this.socket = null;
    this.handlers.onEnded({
      exitCode: this.exit?.exitCode ?? null,
      reason: this.exit?.reason ?? "",
      closeCode,
      exited: this.exit !== null,
      connected: this.connected,
      opened: this.opened,
    });
  }
}

const CLOSE_MESSAGES: Record<number, string> = {
  4401: "You are signed out. Sign in again to open a shell.",
  4403: "Only the job's owner can open a shell.",
  4404: "This job does not exist, or you may not see it.",
  4409: "This job is not running, so it has no shell to open.",
  4429: "Too many shells open; close one first.",
  4504: "The job's node did not answer.",
};

/** How a session ended, in words: a sentence, and the server's reason when it adds something. */
export function describeEnd(end: ShellEnd): { message: string; detail: string | null } {
  const detail = end.reason.trim() || null;
  if (end.closeCode === 4403 && end.opened) {
    return {
      message: "Your access changed (you signed out, your sign-in expired, or your membership changed), so the shell was closed.",
      detail,
    };
  }
  const known = CLOSE_MESSAGES[end.closeCode];
  if (known) return { message: known, detail };
  if (end.exited) {
    const message = end.exitCode === null ? "The shell ended." : `The shell exited with code ${end.exitCode}.`;
    return { message, detail };
  }
  if (!end.connected) return { message: "The shell could not be opened: the portal refused the connection or could not be reached.", detail };
  if (end.closeCode === 1001) return { message: "The portal closed the connection (it may be restarting).", detail };
  if (end.closeCode === 1011) return { message: "The portal failed while the shell was open.", detail };
  return { message: "The connection to the portal was lost.", detail };
}
