import { describe, expect, it } from "vitest";

import {
  BLOCK_LINES,
  BOLD,
  INVERSE,
  type Line,
  MAX_SCROLLBACK,
  Screen,
  chunkInput,
  gridSize,
  keyInput,
  lineRuns,
  pasteInput,
} from "./terminal";

function shown(...frames: string[]): string {
  const screen = new Screen(80, 24);
  frames.forEach((f) => screen.write(f));
  return screen.text();
}

describe("terminal screen", () => {
  it("writes text, lines and carriage returns", () => {
    expect(shown("hello\r\nworld")).toBe("hello\nworld");
    expect(shown("12345\rab")).toBe("ab345");
    expect(shown("a\tb")).toBe("a       b");
    expect(shown("ring\x07 bell")).toBe("ring bell");
  });

  it("overwrites after a backspace", () => {
    expect(shown("ab\bc")).toBe("ac");
    expect(shown("\b\bx")).toBe("x");
    // bash erasing a character: BS, space, BS
    expect(shown("$ lsx\b \b")).toBe("$ ls");
  });

  it("moves the cursor left and right", () => {
    expect(shown("abcdef\x1b[3DX")).toBe("abcXef");
    expect(shown("ab\x1b[DX")).toBe("aX");
    expect(shown("a\x1b[3Cb")).toBe("a   b");
    expect(shown("abc\x1b[100DZ")).toBe("Zbc");
  });

  it("erases in the line", () => {
    expect(shown("abc\r\x1b[K")).toBe("");
    expect(shown("abcdef\x1b[3D\x1b[K")).toBe("abc");
    expect(shown("abcdef\x1b[3D\x1b[1K")).toBe("    ef");
    expect(shown("abcdef\x1b[2K")).toBe("");
  });

  it("clears the display", () => {
    expect(shown("one\r\ntwo\r\nthree", "\x1b[2J")).toBe("");
    // clear(1): home, erase the screen and the scrollback; then the prompt
    expect(shown("one\r\ntwo\r\n", "\x1b[H\x1b[2J\x1b[3J$ ")).toBe("$");
    expect(shown("one\r\ntwo\r\nthree", "\x1b[2;2H\x1b[J")).toBe("one\nt");
  });

  it("positions the cursor", () => {
    expect(shown("\x1b[3;5HX")).toBe("\n\n    X");
    expect(shown("\x1b[HA\x1b[2;1HB")).toBe("A\nB");
    expect(shown("abc\x1b[1GZ")).toBe("Zbc");
  });

  it("strips colours but keeps them as attributes", () => {
    const screen = new Screen();
    screen.write("\x1b[1;31mred\x1b[0m plain \x1b[38;5;3mx\x1b[38;2;1;2;3my\x1b[39m\x1b[7mz\x1b[m");
    expect(screen.text()).toBe("red plain xyz");
    const line = screen.lines[0]!;
    expect(line.attrs[0]).toBe(BOLD | 2); // bold, colour 1 (red)
    expect(line.attrs[3]).toBe(0);
    expect((line.attrs[12] ?? 0) & INVERSE).toBe(INVERSE);
    expect(line.attrs[10]).toBe(4); // 256-colour index 3 (yellow)
    expect(line.attrs[11]).toBe(0); // a 24-bit colour: the default
    expect(lineRuns(line, null).map((r) => r.text)).toEqual(["red", " plain ", "x", "y", "z"]);
  });

  it("drops OSC and other string sequences", () => {
    expect(shown("\x1b]0;user@host: ~\x07")).toBe("");
    expect(shown("\x1b]0;title\x1b\\$ ")).toBe("$");
    expect(shown("a\x1bP1$r0m\x1b\\b")).toBe("ab");
    expect(shown("\x1b]633;A\x07$ \x1b]633;B\x07ls")).toBe("$ ls");
  });

  it("handles a sequence split across output frames", () => {
    expect(shown("red \x1b[3", "1mtext\x1b", "[0m!")).toBe("red text!");
    expect(shown("abc\x1b", "[", "2", "D", "X")).toBe("aXc");
    expect(shown("\x1b]0;ti", "tle\x1b", "\\ok")).toBe("ok");
  });

  it("drops unknown sequences without garbage", () => {
    expect(shown("a\x1b[?2004hb\x1b[?2004lc")).toBe("abc");
    expect(shown("a\x1b[>4;1mb\x1b[2 qc\x1b(Bd\x1b=e\x1b>f\x1b[5~g")).toBe("abcdefg");
    expect(shown("a\x9bb")).toBe("ab");
    // a sequence cut short by another one
    expect(shown("a\x1b[12\x1b[Cb")).toBe("a b");
    // far too long parameters
    expect(shown(`a\x1b[${"1;".repeat(100)}mb`)).toBe("ab");
  });

  it("inserts and deletes characters as readline does", () => {
    // typing 'X' in the middle of "abc" (cursor after 'a'): insert one blank, then the character
    expect(shown("abc\x1b[2D\x1b[@X")).toBe("aXbc");
    // deleting the character under the cursor
    expect(shown("abc\x1b[2D\x1b[P")).toBe("ac");
    expect(shown("abcdef\x1b[5D\x1b[2X")).toBe("a  def");
  });

  it("wraps long lines and scrolls, keeping a bounded scrollback", () => {
    const screen = new Screen(20, 5);
    screen.write("x".repeat(25));
    expect(screen.lineTexts().slice(0, 2)).toEqual(["x".repeat(20), "xxxxx"]);
    for (let i = 0; i < MAX_SCROLLBACK + 500; i++) screen.write(`line ${i}\r\n`);
    expect(screen.lines.length).toBeLessThanOrEqual(MAX_SCROLLBACK + 200 + 5);
    expect(screen.text().endsWith(`line ${MAX_SCROLLBACK + 499}`)).toBe(true);
    // cursor addressing is relative to the screen, not the scrollback
    screen.write("\x1b[1;1HTOP");
    const lines = screen.lineTexts();
    expect(lines[screen.top]?.startsWith("TOP")).toBe(true);
  });

  it("shows a full-screen program on the alternate screen and restores the shell after", () => {
    const screen = new Screen(20, 5);
    screen.write("$ less file\r\n");
    screen.write("\x1b[?1049h\x1b[H\x1b[2Jpage one\x1b[5;1H\x1b[7m:\x1b[m");
    expect(screen.alternate).toBe(true);
    expect(screen.text()).toBe("page one\n\n\n\n:");
    screen.write("\x1b[?1049l$ ");
    expect(screen.alternate).toBe(false);
    expect(screen.text()).toBe("$ less file\n$");
  });

  it("scrolls only inside a scrolling region", () => {
    const screen = new Screen(20, 5);
    // a status line on the last row; the region is rows 1-4
    screen.write("\x1b[1;4r\x1b[5;1Hstatus\x1b[1;1Ha\r\nb\r\nc\r\nd\r\ne");
    expect(screen.text()).toBe("b\nc\nd\ne\nstatus");
    expect(screen.top).toBe(0);
    // reverse index at the top of the region scrolls it down
    screen.write("\x1b[1;1H\x1bMz");
    expect(screen.text()).toBe("z\nb\nc\nd\nstatus");
    // insert and delete lines stay inside the region
    screen.write("\x1b[2;1H\x1b[L");
    expect(screen.text()).toBe("z\n\nb\nc\nstatus");
    screen.write("\x1b[2M");
    expect(screen.text()).toBe("z\nc\n\n\nstatus");
    // a line feed on the last row, outside the region, scrolls nothing
    screen.write("\x1b[5;1H\n");
    expect(screen.text()).toBe("z\nc\n\n\nstatus");
    // the whole screen again: the top line goes to the scrollback
    screen.write("\x1b[r\x1b[5;1H\nnew");
    expect(screen.top).toBe(1);
    expect(screen.lineTexts()).toEqual(["z", "c", "", "", "status", "new"]);
  });

  it("answers a cursor position query and tracks key modes", () => {
    const screen = new Screen();
    screen.write("ab\r\ncd\x1b[6n");
    expect(screen.takeReplies()).toEqual(["\x1b[2;3R"]);
    expect(screen.takeReplies()).toEqual([]);
    screen.write("\x1b[?1h\x1b[?2004h\x1b[?25l");
    expect(screen.appCursorKeys).toBe(true);
    expect(screen.bracketedPaste).toBe(true);
    expect(screen.cursorVisible).toBe(false);
  });

  it("keeps the cursor on the screen when resized", () => {
    const screen = new Screen(40, 10);
    for (let i = 0; i < 30; i++) screen.write(`${i}\r\n`);
    screen.resize(20, 4);
    expect(screen.row - screen.top).toBeLessThan(4);
    screen.resize(20, 8);
    expect(screen.row - screen.top).toBe(7);
    expect(screen.cols).toBe(20);
  });

  it("puts the cursor in a run of its own", () => {
    const screen = new Screen();
    screen.write("abc\x1b[2D");
    const { lines, cursorIndex, cursorCol } = screen.view();
    expect(cursorIndex).toBe(0);
    expect(lineRuns(lines[0]!, cursorCol)).toEqual([
      { text: "a", attr: 0, cursor: false },
      { text: "b", attr: 0, cursor: true },
      { text: "c", attr: 0, cursor: false },
    ]);
    expect(lineRuns(lines[0]!, 5).map((r) => r.text)).toEqual(["abc  ", " "]);
  });

  it("works out the grid from the box and character size", () => {
    expect(gridSize(800, 480, 8, 20)).toEqual({ cols: 100, rows: 24 });
    expect(gridSize(81, 39, 8, 20)).toEqual({ cols: 20, rows: 5 });
    expect(gridSize(800, 480, 0, 0)).toEqual({ cols: 80, rows: 24 });
  });
});

/** Each line shown, by id: its version and what it shows. */
function lineStates(screen: Screen): Map<number, { rev: number; content: string }> {
  return new Map(screen.view().lines.map((line) => [line.id, { rev: line.rev, content: lineContent(line) }]));
}

function lineContent(line: Line): string {
  return JSON.stringify([line.chars, line.attrs]);
}

/** Each block shown, by key: its version and the lines it holds (ids, versions and contents). */
function blockStates(screen: Screen): Map<string, { version: number; content: string }> {
  return new Map(
    screen.blocks().blocks.map((block) => {
      const lines = screen.linesAt(block.start, block.count).map((line) => [line.id, line.rev, lineContent(line)]);
      return [block.key, { version: block.version, content: JSON.stringify([block.start, lines]) }];
    }),
  );
}

/** The ids of the lines whose version changed, or that are new. */
function changedLines(before: Map<number, { rev: number }>, after: Map<number, { rev: number }>): number[] {
  return [...after].filter(([id, state]) => before.get(id)?.rev !== state.rev).map(([id]) => id);
}

function changedBlocks(before: Map<string, { version: number }>, after: Map<string, { version: number }>): string[] {
  return [...after].filter(([key, state]) => before.get(key)?.version !== state.version).map(([key]) => key);
}

describe("terminal screen, drawn incrementally", () => {
  it("changes the version of only the line written", () => {
    const screen = new Screen(40, 10);
    screen.write("one\r\ntwo\r\nthree\r\n$ ");
    const before = lineStates(screen);
    const [one, two, three, prompt] = screen.view().lines;
    screen.write("ls");
    const after = lineStates(screen);
    expect(changedLines(before, after)).toEqual([prompt!.id]);
    // an edit in the middle of the screen (cursor up, overwrite) touches that line only
    screen.write("\x1b[2;1HTWO\x1b[4;5H");
    expect(changedLines(after, lineStates(screen))).toEqual([two!.id]);
    expect([one, three].map((line) => line!.rev)).toEqual([after.get(one!.id)!.rev, after.get(three!.id)!.rev]);
    // moving the cursor, or an erase that finds no line, changes no line
    const moved = lineStates(screen);
    screen.write("\x1b[H\x1b[3C\x1b[B");
    expect(changedLines(moved, lineStates(screen))).toEqual([]);
  });

  it("keeps the versions of lines scrolled off into the scrollback", () => {
    const screen = new Screen(20, 5);
    for (let i = 0; i < 30; i++) screen.write(`line ${i}\r\n`);
    const scrollback = screen.view().lines.slice(0, screen.top);
    const before = new Map(scrollback.map((line) => [line.id, line.rev]));
    for (let i = 30; i < 60; i++) screen.write(`line ${i}\r\n`);
    for (const line of scrollback) expect(line.rev).toBe(before.get(line.id));
    expect(screen.view().lines.slice(0, scrollback.length)).toEqual(scrollback);
    // and their blocks keep their keys and versions: only the blocks at the end changed
    const blocks = blockStates(screen);
    screen.write("more\r\n");
    const changed = changedBlocks(blocks, blockStates(screen));
    expect(changed).toEqual([screen.blocks().blocks.at(-1)!.key]);
  });

  it("marks the lines of the screen changed on clear, and keeps the scrollback's", () => {
    const screen = new Screen(20, 5);
    for (let i = 0; i < 8; i++) screen.write(`line ${i}\r\n`);
    screen.write("$ ");
    const scrollback = screen.view().lines.slice(0, screen.top);
    const before = lineStates(screen);
    screen.write("\x1b[H\x1b[2J$ ");
    const after = lineStates(screen);
    const shown = screen.view().lines;
    // every line of the screen is new or changed; those of the scrollback are untouched
    for (const line of shown.slice(screen.top)) expect(before.get(line.id)?.rev).not.toBe(line.rev);
    expect(shown.slice(0, screen.top)).toEqual(scrollback);
    expect(changedLines(before, after).length).toBe(1); // the new prompt line (the others are blank, not yet made)
    expect(screen.text()).toBe(`${scrollback.map((l) => l.chars.join("")).join("\n")}\n$`);
    // clearing the scrollback too (clear's E3) leaves only the screen
    screen.write("\x1b[3J");
    expect(screen.top).toBe(0);
    expect(screen.text()).toBe("$");
  });

  it("keeps block keys and versions while old lines leave the scrollback", () => {
    const screen = new Screen(20, 5);
    for (let i = 0; i < MAX_SCROLLBACK + 150; i++) screen.write(`line ${i}\r\n`);
    const before = screen.blocks().blocks;
    // enough lines for the scrollback to be trimmed (in a batch)
    for (let i = 0; i < 300; i++) screen.write(`more ${i}\r\n`);
    const after = screen.blocks().blocks;
    expect(after[0]!.start).toBeGreaterThan(before[0]!.start); // old lines left
    const kept = after.filter((block) => before.some((b) => b.key === block.key));
    expect(kept.length).toBeGreaterThan(10);
    // the blocks still shown, whole, that no line was written to are unchanged
    const last = before.at(-1)!;
    for (const block of kept.slice(1)) {
      const old = before.find((b) => b.key === block.key)!;
      if (old.key === last.key) continue;
      expect(block).toEqual(old);
    }
    // the blocks cover the lines shown, in order, in runs of at most BLOCK_LINES
    const lines = after.flatMap((block) => screen.linesAt(block.start, block.count));
    expect(lines).toEqual(screen.view().lines);
    expect(after.every((block) => block.count >= 1 && block.count <= BLOCK_LINES)).toBe(true);
    after.slice(1).forEach((block, i) => expect(block.start).toBe(after[i]!.start + after[i]!.count));
    expect(new Set(after.map((block) => block.key)).size).toBe(after.length);
  });

  it("gives the alternate screen blocks of its own and the shell's back after", () => {
    const screen = new Screen(20, 5);
    for (let i = 0; i < 100; i++) screen.write(`line ${i}\r\n`);
    const main = screen.blocks().blocks.map((block) => block.key);
    screen.write("\x1b[?1049h\x1b[H\x1b[2Jpage");
    const alternate = screen.blocks();
    expect(alternate.blocks.map((block) => block.key).some((key) => main.includes(key))).toBe(false);
    expect(alternate.blocks.flatMap((b) => screen.linesAt(b.start, b.count))).toEqual(screen.view().lines);
    expect(alternate.cursorLine).toBe(alternate.blocks[0]!.start);
    screen.write("\x1b[?1049l");
    const back = screen.blocks().blocks;
    const keys = alternate.blocks.map((block) => block.key);
    expect(back.map((block) => block.key).some((key) => main.includes(key) || keys.includes(key))).toBe(false);
    expect(back.flatMap((b) => screen.linesAt(b.start, b.count))).toEqual(screen.view().lines);
    expect(screen.lineTexts().slice(0, 3)).toEqual(["line 0", "line 1", "line 2"]);
  });

  it("changes the version of a block whenever what it shows changes", () => {
    // Random output of all kinds; after each write, a block that kept its key and version must
    // show the same lines with the same content, and a line that kept its version the same content.
    let seed = 12345;
    const random = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    const pieces = [
      () => `text ${random(1000)}`,
      () => "x".repeat(random(50)),
      () => "\r\n",
      () => "\r\n\r\n\r\n",
      () => "\r",
      () => "\b\b",
      () => `\x1b[${random(6) + 1}A`,
      () => `\x1b[${random(6) + 1}B`,
      () => `\x1b[${random(8) + 1};${random(30) + 1}H`,
      () => `\x1b[${random(4)}J`,
      () => `\x1b[${random(3)}K`,
      () => `\x1b[${random(5) + 1}X`,
      () => `\x1b[${random(5) + 1}P`,
      () => `\x1b[${random(5) + 1}@`,
      () => `\x1b[${random(3) + 1}L`,
      () => `\x1b[${random(3) + 1}M`,
      () => `\x1b[${random(3) + 1}S`,
      () => `\x1b[${random(3) + 1}T`,
      () => `\x1b[${random(3) + 1};${random(4) + 5}r`,
      () => "\x1b[r",
      () => "\x1bM",
      () => "\x1bD",
      () => `\x1b[3${random(8)}m`,
      () => "\x1b[0m",
      () => (random(4) === 0 ? "\x1b[?1049h" : "\x1b[?1049l"),
      () => (random(20) === 0 ? "\x1bc" : ""),
      () => Array.from({ length: 100 + random(400) }, (_, i) => `${i}\r\n`).join(""),
    ];
    const screen = new Screen(30, 8);
    let blocks = blockStates(screen);
    let lines = lineStates(screen);
    for (let step = 0; step < 3000; step++) {
      if (random(50) === 0) screen.resize(20 + random(30), 4 + random(10));
      else screen.write(pieces[random(pieces.length)]!());
      const nextBlocks = blockStates(screen);
      const nextLines = lineStates(screen);
      for (const [key, state] of nextBlocks) {
        const old = blocks.get(key);
        if (old && old.version === state.version) expect(state.content, `block ${key} at step ${step}`).toBe(old.content);
      }
      for (const [id, state] of nextLines) {
        const old = lines.get(id);
        if (old && old.rev === state.rev) expect(state.content, `line ${id} at step ${step}`).toBe(old.content);
      }
      blocks = nextBlocks;
      lines = nextLines;
    }
  });
});

describe("terminal keys", () => {
  it("sends what a terminal sends", () => {
    expect(keyInput({ key: "Enter" })).toBe("\r");
    expect(keyInput({ key: "Backspace" })).toBe("\x7f");
    expect(keyInput({ key: "Tab" })).toBe("\t");
    expect(keyInput({ key: "Escape" })).toBe("\x1b");
    expect(keyInput({ key: "a" })).toBe("a");
    expect(keyInput({ key: "A", shiftKey: true })).toBe("A");
    expect(keyInput({ key: "é" })).toBe("é");
    expect(keyInput({ key: "😀" })).toBe("😀");
    expect(keyInput({ key: " " })).toBe(" ");
  });

  it("sends control characters for Ctrl and an ESC prefix for Alt", () => {
    expect(keyInput({ key: "c", ctrlKey: true })).toBe("\x03");
    expect(keyInput({ key: "d", ctrlKey: true })).toBe("\x04");
    expect(keyInput({ key: "Z", ctrlKey: true, shiftKey: true })).toBe("\x1a");
    expect(keyInput({ key: "[", ctrlKey: true })).toBe("\x1b");
    expect(keyInput({ key: " ", ctrlKey: true })).toBe("\x00");
    expect(keyInput({ key: "b", altKey: true })).toBe("\x1bb");
    expect(keyInput({ key: "@", ctrlKey: true, altKey: true })).toBe("@"); // AltGr
  });

  it("sends cursor and editing keys", () => {
    expect(keyInput({ key: "ArrowUp" })).toBe("\x1b[A");
    expect(keyInput({ key: "ArrowDown" })).toBe("\x1b[B");
    expect(keyInput({ key: "ArrowRight" })).toBe("\x1b[C");
    expect(keyInput({ key: "ArrowLeft" })).toBe("\x1b[D");
    expect(keyInput({ key: "ArrowUp" }, true)).toBe("\x1bOA");
    expect(keyInput({ key: "ArrowLeft", ctrlKey: true })).toBe("\x1b[1;5D");
    expect(keyInput({ key: "Home" })).toBe("\x1b[H");
    expect(keyInput({ key: "End" })).toBe("\x1b[F");
    expect(keyInput({ key: "Delete" })).toBe("\x1b[3~");
    expect(keyInput({ key: "PageUp" })).toBe("\x1b[5~");
    expect(keyInput({ key: "F1" })).toBe("\x1bOP");
    expect(keyInput({ key: "F12" })).toBe("\x1b[24~");
  });

  it("leaves the browser's keys to the browser", () => {
    expect(keyInput({ key: "Tab", shiftKey: true })).toBeNull();
    expect(keyInput({ key: "v", ctrlKey: true })).toBeNull();
    expect(keyInput({ key: "C", ctrlKey: true, shiftKey: true })).toBeNull();
    expect(keyInput({ key: "c", metaKey: true })).toBeNull();
    expect(keyInput({ key: "PageUp", shiftKey: true })).toBeNull();
    expect(keyInput({ key: "Shift", shiftKey: true })).toBeNull();
    expect(keyInput({ key: "Dead" })).toBeNull();
    expect(keyInput({ key: "Process" })).toBeNull();
  });

  it("pastes line breaks as Enter, bracketed when the shell asks", () => {
    expect(pasteInput("ls\nwhoami\r\n", false)).toBe("ls\rwhoami\r");
    expect(pasteInput("echo hi\n", true)).toBe("\x1b[200~echo hi\r\x1b[201~");
    expect(pasteInput("a\x1b[201~b", true)).toBe("\x1b[200~ab\x1b[201~");
  });

  it("splits long input without cutting a character in two", () => {
    expect(chunkInput("")).toEqual([]);
    expect(chunkInput("abcdef", 4)).toEqual(["abcd", "ef"]);
    expect(chunkInput("abc😀d", 4)).toEqual(["abc", "😀d"]);
    expect(chunkInput("x".repeat(70_000)).map((c) => c.length)).toEqual([65536, 70_000 - 65536]);
  });
});
