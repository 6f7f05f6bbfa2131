// The screen of the job shell's terminal, and the keys a terminal sends. Pure: no DOM, no React.
//
// Not a full VT100: enough for what sh, bash and the common tools print. Printable text, CR, LF,
// BS and TAB; BEL and the other controls are ignored. CSI sequences move the cursor (A-G, H, d),
// erase (J, K, X), insert and delete characters and lines (@, P, L, M), scroll (S, T, and the
// scrolling region of full-screen programs: r), set a few colours (SGR: the 16 basic ones, bold,
// underline, inverse), and switch the modes that change what keys send (application cursor keys,
// bracketed paste) or what is shown (the cursor, the alternate screen of full-screen programs).
// OSC, DCS and the other string sequences are dropped up to their end (BEL or ESC \), and any
// sequence it does not know is dropped whole, never shown as text. The parser keeps its state
// between writes, so a sequence split across two output frames works. Wide characters take one
// cell, and nothing is reflowed when the size changes.
//
// Drawing is incremental: every change stamps the line it touched (`Line.rev`) and the block of
// lines it is in (`blocks()`) with a new number, so a view redraws only the blocks and lines whose
// stamp moved since it last drew them, however long the scrollback.

export const DEFAULT_COLS = 80;
export const DEFAULT_ROWS = 24;
/** Lines kept above the screen. */
export const MAX_SCROLLBACK = 2000;
/** Lines in a block of the view (see `Screen.blocks`). */
export const BLOCK_LINES = 64;

// A cell's attributes, packed in one number: bits 0-4 the foreground (0: default, 1 + n: colour
// n of the 16 basic ones), then bold, underline and inverse.
export const FG_MASK = 31;
export const BOLD = 32;
export const UNDERLINE = 64;
export const INVERSE = 128;

const MAX_SEQUENCE = 64; // longer CSI parameters are a garbled sequence: dropped
const MAX_PARAM = 9999;

export interface Line {
  /** Stable for the life of the line (a key for rendering). */
  readonly id: number;
  chars: string[];
  attrs: number[];
  /** Changes whenever the line does (a stamp from a counter of the screen: it only grows). */
  rev: number;
}

/**
 * A run of lines shown, at most BLOCK_LINES of them, for drawing: `key` and the lines it covers stay
 * the same while they are shown, and `version` changes whenever any of them, or which lines they
 * are, does. Positions count lines from the first one the screen ever had, so they do not move
 * when old lines leave the scrollback.
 */
export interface LineBlock {
  readonly key: string;
  /** The position of its first line shown (for `linesAt`). */
  readonly start: number;
  readonly count: number;
  readonly version: number;
}

type ParserState = "ground" | "escape" | "csi" | "string" | "string-escape" | "skip-one";

interface Cursor {
  row: number; // relative to the top of the screen
  col: number;
  attr: number;
}

interface SavedScreen {
  lines: Line[];
  top: number;
  row: number;
  col: number;
  base: number;
  blockVersions: Map<number, number>;
}

export class Screen {
  cols: number;
  rows: number;
  /** Scrollback and screen: the screen is `lines[top]` to `lines[top + rows - 1]`; lines past the
   * end of the array are blank (made when written to). */
  lines: Line[] = [];
  top = 0;
  /** The cursor: an index into `lines`, and a column (`cols` while a wrap is pending). */
  row = 0;
  col = 0;
  attr = 0;
  cursorVisible = true;
  /** DECCKM: arrows send ESC O A rather than ESC [ A. */
  appCursorKeys = false;
  /** Mode 2004: a paste goes between ESC [ 200 ~ and ESC [ 201 ~. */
  bracketedPaste = false;

  /** The scrolling region, rows relative to the top of the screen (DECSTBM). */
  private regionTop = 0;
  private regionBottom: number;
  private state: ParserState = "ground";
  private sequence = "";
  private nextId = 1;
  private saved: Cursor | null = null;
  private main: SavedScreen | null = null; // set while the alternate screen is shown
  private replies: string[] = [];
  /** The position of `lines[0]`: how many lines left the front of `lines` so far. */
  private base = 0;
  /** The stamp of the last change to each block (by block number: position / BLOCK_LINES). */
  private blockVersions = new Map<number, number>();
  /** The counter the stamps come from. */
  private changes = 0;
  /** Changes when `lines` becomes other lines altogether (alternate screen, reset): new block keys. */
  private generation = 0;

  constructor(cols = DEFAULT_COLS, rows = DEFAULT_ROWS) {
    this.cols = clamp(Math.floor(cols), 2, 1000);
    this.rows = clamp(Math.floor(rows), 2, 1000);
    this.regionBottom = this.rows - 1;
  }

  get alternate(): boolean {
    return this.main !== null;
  }

  /** Interprets output of the shell. */
  write(text: string): void {
    for (const ch of text) this.feed(ch);
  }

  /** What the terminal must send back (answers to status queries), emptied by the call. */
  takeReplies(): string[] {
    const replies = this.replies;
    this.replies = [];
    return replies;
  }

  /** The lines to show (the alternate screen has no scrollback), and which one has the cursor. */
  view(): { lines: Line[]; cursorIndex: number; cursorCol: number } {
    this.lineAt(this.row);
    const first = this.main ? this.top : 0;
    return {
      lines: this.lines.slice(first),
      cursorIndex: this.row - first,
      cursorCol: Math.min(this.col, this.cols - 1),
    };
  }

  /**
   * The lines `view` shows, in blocks of at most BLOCK_LINES, and where the cursor is: the
   * position of its line and its column. Cheap: one entry per block, not per line.
   */
  blocks(): { blocks: LineBlock[]; cursorLine: number; cursorCol: number } {
    this.lineAt(this.row);
    const blocks: LineBlock[] = [];
    const end = this.base + this.lines.length;
    for (let start = this.base + (this.main ? this.top : 0); start < end; ) {
      const number = Math.floor(start / BLOCK_LINES);
      const stop = Math.min(end, (number + 1) * BLOCK_LINES);
      blocks.push({
        key: `${this.generation}:${number}`,
        start,
        count: stop - start,
        version: this.blockVersions.get(number) ?? 0,
      });
      start = stop;
    }
    return { blocks, cursorLine: this.base + this.row, cursorCol: Math.min(this.col, this.cols - 1) };
  }

  /** The lines at `count` positions from `start` (see `blocks`). */
  linesAt(start: number, count: number): Line[] {
    const first = Math.max(0, start - this.base);
    return this.lines.slice(first, Math.max(first, start - this.base + count));
  }

  /** The text of every line shown, trailing blanks removed; for tests and copying. */
  lineTexts(): string[] {
    return this.view().lines.map((line) => line.chars.join("").replace(/\s+$/, ""));
  }

  /** The lines shown as one text, without trailing empty lines. */
  text(): string {
    return this.lineTexts().join("\n").replace(/\n+$/, "");
  }

  resize(cols: number, rows: number): void {
    this.cols = clamp(Math.floor(cols), 2, 1000);
    this.rows = clamp(Math.floor(rows), 2, 1000);
    this.regionTop = 0;
    this.regionBottom = this.rows - 1;
    // Growing shows lines from the scrollback again, as terminals do; the cursor stays on screen.
    this.top = Math.max(0, this.row - this.rows + 1, Math.min(this.top, this.lines.length - this.rows));
    this.col = Math.min(this.col, this.cols);
    this.trimScrollback();
  }

  // -- parser -----------------------------------------------------------------------------

  private feed(ch: string): void {
    const code = ch.codePointAt(0) ?? 0;
    switch (this.state) {
      case "ground":
        if (code === 0x1b) this.state = "escape";
        else if (code < 0x20 || code === 0x7f) this.control(code);
        else if (code >= 0x80 && code < 0xa0) return; // C1 controls: dropped
        else this.print(ch);
        return;
      case "escape":
        this.state = "ground";
        this.escape(ch, code);
        return;
      case "csi":
        if (code === 0x1b) {
          this.state = "escape"; // a sequence cut short by another one
        } else if (code >= 0x40 && code <= 0x7e) {
          this.state = "ground";
          if (this.sequence.length <= MAX_SEQUENCE) this.csi(this.sequence, ch);
        } else if (code >= 0x20 && code <= 0x3f) {
          if (this.sequence.length <= MAX_SEQUENCE) this.sequence += ch;
        } else if (code < 0x20) {
          this.control(code); // controls inside a sequence act as usual
        } else {
          this.state = "ground"; // not a sequence after all: dropped
        }
        return;
      case "string":
        if (code === 0x07 || code === 0x18 || code === 0x1a) this.state = "ground";
        else if (code === 0x1b) this.state = "string-escape";
        return;
      case "string-escape":
        if (ch === "\\") {
          this.state = "ground";
        } else {
          // An ESC that is not the string terminator ends the string and starts a sequence.
          this.state = "escape";
          this.feed(ch);
        }
        return;
      case "skip-one":
        this.state = "ground";
        return;
    }
  }

  private control(code: number): void {
    switch (code) {
      case 0x08: // BS
        this.col = Math.max(0, Math.min(this.col, this.cols - 1) - 1);
        break;
      case 0x09: // TAB
        this.col = Math.min(this.cols - 1, (Math.floor(this.col / 8) + 1) * 8);
        break;
      case 0x0a: // LF, VT, FF
      case 0x0b:
      case 0x0c:
        this.lineFeed();
        break;
      case 0x0d: // CR
        this.col = 0;
        break;
      default: // BEL, NUL, SO/SI and the rest: nothing to show
        break;
    }
  }

  private escape(ch: string, code: number): void {
    switch (ch) {
      case "[":
        this.state = "csi";
        this.sequence = "";
        return;
      case "]": // OSC (window title, ...), DCS, SOS, PM, APC: strings, dropped
      case "P":
      case "X":
      case "^":
      case "_":
        this.state = "string";
        return;
      case "(": // character sets and other two-character sequences
      case ")":
      case "*":
      case "+":
      case "-":
      case ".":
      case "/":
      case "#":
      case "%":
      case " ":
        this.state = "skip-one";
        return;
      case "7":
        this.saveCursor();
        return;
      case "8":
        this.restoreCursor();
        return;
      case "D":
        this.lineFeed();
        return;
      case "E":
        this.col = 0;
        this.lineFeed();
        return;
      case "M":
        this.reverseIndex();
        return;
      case "c":
        this.reset();
        return;
      default:
        if (code === 0x1b) this.state = "escape";
        else if (code < 0x20) this.control(code);
        // anything else (ESC =, ESC >, a stray ESC \ ...) is dropped
        return;
    }
  }

  private csi(body: string, final: string): void {
    const prefix = /^[?>=<]/.test(body) ? body[0] : "";
    const rest = prefix ? body.slice(1) : body;
    if (/[ -/]/.test(rest)) return; // intermediate bytes (cursor style, soft reset...): ignored
    const params = rest === "" ? [] : rest.split(";");
    const number = (index: number, fallback: number): number => {
      const text = params[index];
      if (text === undefined || text === "" || !/^\d+$/.test(text)) return fallback;
      return Math.min(Number(text), MAX_PARAM);
    };
    const count = (index = 0) => Math.max(1, number(index, 1));

    if (prefix === "?") {
      if (final === "h" || final === "l") params.forEach((p) => this.privateMode(Number(p), final === "h"));
      return;
    }
    if (prefix) return;

    const bottom = this.top + this.rows - 1;
    switch (final) {
      case "A":
        this.row = Math.max(this.top, this.row - count());
        this.col = Math.min(this.col, this.cols - 1);
        break;
      case "B":
      case "e":
        this.row = Math.min(bottom, this.row + count());
        this.col = Math.min(this.col, this.cols - 1);
        break;
      case "C":
      case "a":
        this.col = Math.min(this.cols - 1, this.col + count());
        break;
      case "D":
        this.col = Math.max(0, Math.min(this.col, this.cols - 1) - count());
        break;
      case "E":
        this.row = Math.min(bottom, this.row + count());
        this.col = 0;
        break;
      case "F":
        this.row = Math.max(this.top, this.row - count());
        this.col = 0;
        break;
      case "G":
      case "`":
        this.col = clamp(count() - 1, 0, this.cols - 1);
        break;
      case "H":
      case "f":
        this.row = this.top + clamp(count(0) - 1, 0, this.rows - 1);
        this.col = clamp(count(1) - 1, 0, this.cols - 1);
        break;
      case "d":
        this.row = this.top + clamp(count() - 1, 0, this.rows - 1);
        break;
      case "J":
        this.eraseDisplay(number(0, 0));
        break;
      case "K":
        this.eraseLine(number(0, 0));
        break;
      case "X":
        this.eraseChars(count());
        break;
      case "P":
        this.deleteChars(count());
        break;
      case "@":
        this.insertChars(count());
        break;
      case "L":
        this.insertLines(count());
        break;
      case "M":
        this.deleteLines(count());
        break;
      case "S":
        this.scrollUp(count());
        break;
      case "T":
        this.scrollDown(count());
        break;
      case "m":
        this.sgr(params);
        break;
      case "n":
        if (number(0, 0) === 5) this.replies.push("\x1b[0n");
        else if (number(0, 0) === 6) {
          this.replies.push(`\x1b[${this.row - this.top + 1};${Math.min(this.col, this.cols - 1) + 1}R`);
        }
        break;
      case "c":
        if (number(0, 0) === 0) this.replies.push("\x1b[?1;2c");
        break;
      case "s":
        this.saveCursor();
        break;
      case "u":
        this.restoreCursor();
        break;
      case "r": {
        // the scrolling region (DECSTBM); it homes the cursor
        const first = count(0) - 1;
        const last = Math.min(number(1, this.rows), this.rows) - 1;
        if (first < last) {
          this.regionTop = first;
          this.regionBottom = last;
        }
        this.row = this.top;
        this.col = 0;
        break;
      }
      default: // modes, window operations, tab stops...: ignored
        break;
    }
  }

  private privateMode(mode: number, on: boolean): void {
    switch (mode) {
      case 1:
        this.appCursorKeys = on;
        break;
      case 25:
        this.cursorVisible = on;
        break;
      case 2004:
        this.bracketedPaste = on;
        break;
      case 47:
      case 1047:
      case 1049:
        if (on) this.enterAlternate(mode === 1049);
        else this.leaveAlternate(mode === 1049);
        break;
      default:
        break;
    }
  }

  private sgr(params: string[]): void {
    const values = params.length ? params : ["0"];
    for (let i = 0; i < values.length; i++) {
      const text = values[i] ?? "";
      if (text.includes(":")) continue; // colon sub-parameters (38:2:r:g:b, 4:3): a whole colour, ignored
      const p = text === "" ? 0 : Number(text);
      if (p === 0) this.attr = 0;
      else if (p === 1) this.attr |= BOLD;
      else if (p === 22) this.attr &= ~BOLD;
      else if (p === 4) this.attr |= UNDERLINE;
      else if (p === 24) this.attr &= ~UNDERLINE;
      else if (p === 7) this.attr |= INVERSE;
      else if (p === 27) this.attr &= ~INVERSE;
      else if (p >= 30 && p <= 37) this.setForeground(p - 30);
      else if (p >= 90 && p <= 97) this.setForeground(p - 90 + 8);
      else if (p === 39) this.setForeground(null);
      else if (p === 38 || p === 48) {
        const kind = values[i + 1];
        if (kind === "5") {
          const index = Number(values[i + 2]);
          if (p === 38) this.setForeground(index >= 0 && index < 16 ? index : null);
          i += 2;
        } else if (kind === "2") {
          if (p === 38) this.setForeground(null);
          i += 4;
        }
      }
      // backgrounds, italics, blinking and the rest: ignored
    }
  }

  private setForeground(colour: number | null): void {
    this.attr = (this.attr & ~FG_MASK) | (colour === null ? 0 : colour + 1);
  }

  // -- the screen -------------------------------------------------------------------------

  private newLine(): Line {
    return { id: this.nextId++, chars: [], attrs: [], rev: this.changes };
  }

  private lineAt(row: number): Line {
    const length = this.lines.length;
    if (length <= row) {
      while (this.lines.length <= row) this.lines.push(this.newLine());
      this.moved(length, row);
    }
    return this.lines[row] as Line;
  }

  /** What line `row` (an index into `lines`) shows changed: stamps it and its block. */
  private touch(row: number): void {
    const line = this.lines[row];
    if (!line) return;
    line.rev = ++this.changes;
    this.blockVersions.set(Math.floor((this.base + row) / BLOCK_LINES), line.rev);
  }

  /** Lines came, went or moved at indices `from` to `to`: stamps the blocks there (not the lines). */
  private moved(from: number, to: number): void {
    if (to < from) return;
    const stamp = ++this.changes;
    const last = Math.floor((this.base + to) / BLOCK_LINES);
    for (let block = Math.floor((this.base + from) / BLOCK_LINES); block <= last; block++) {
      this.blockVersions.set(block, stamp);
    }
  }

  /** Removes the first `n` lines (old scrollback). */
  private dropFront(n: number): void {
    if (n <= 0) return;
    const firstBlock = Math.floor(this.base / BLOCK_LINES);
    this.lines.splice(0, n);
    this.base += n;
    this.top -= n;
    this.row -= n;
    for (let block = firstBlock; block < Math.floor(this.base / BLOCK_LINES); block++) this.blockVersions.delete(block);
    // the block the first line left is in may have lost some of its lines
    this.blockVersions.set(Math.floor(this.base / BLOCK_LINES), ++this.changes);
  }

  private print(ch: string): void {
    if (this.col >= this.cols) {
      this.col = 0;
      this.lineFeed();
    }
    const line = this.lineAt(this.row);
    while (line.chars.length < this.col) {
      line.chars.push(" ");
      line.attrs.push(0);
    }
    line.chars[this.col] = ch;
    line.attrs[this.col] = this.attr;
    this.touch(this.row);
    this.col++;
  }

  private get fullRegion(): boolean {
    return this.regionTop === 0 && this.regionBottom === this.rows - 1;
  }

  private lineFeed(): void {
    if (this.row === this.top + this.regionBottom && !this.fullRegion) {
      this.scrollUp(1); // at the bottom of a scrolling region: the region scrolls, nothing leaves the screen
    } else if (this.row < this.top + this.rows - 1) {
      this.row++;
    } else if (this.fullRegion) {
      // at the bottom of the screen: the top line goes to the scrollback
      this.row++;
      this.top++;
      this.trimScrollback();
    }
  }

  private reverseIndex(): void {
    if (this.row === this.top + this.regionTop) this.scrollDown(1);
    else if (this.row > this.top) this.row--;
  }

  private trimScrollback(): void {
    const keep = this.main ? 0 : MAX_SCROLLBACK;
    const slack = this.main ? 0 : 200; // trimmed in batches
    if (this.top <= keep + slack) return;
    this.dropFront(this.top - keep);
  }

  private eraseDisplay(mode: number): void {
    const length = this.lines.length;
    if (mode === 0) {
      this.lines.splice(this.row + 1);
      this.moved(this.row + 1, length - 1);
      this.eraseLine(0);
    } else if (mode === 1) {
      for (let r = this.top; r < this.row && r < this.lines.length; r++) this.lines[r] = this.newLine();
      this.moved(this.top, Math.min(this.row, length) - 1);
      this.eraseLine(1);
    } else if (mode === 2) {
      this.lines.splice(this.top);
      this.moved(this.top, length - 1);
    } else if (mode === 3) {
      this.dropFront(this.top);
    }
  }

  private eraseLine(mode: number): void {
    const line = this.lines[this.row];
    if (!line) return;
    if (mode === 0) {
      line.chars.length = Math.min(line.chars.length, this.col);
      line.attrs.length = line.chars.length;
    } else if (mode === 1) {
      const end = Math.min(this.col, this.cols - 1, line.chars.length - 1);
      for (let c = 0; c <= end; c++) {
        line.chars[c] = " ";
        line.attrs[c] = 0;
      }
    } else if (mode === 2) {
      line.chars = [];
      line.attrs = [];
    }
    this.touch(this.row);
  }

  private eraseChars(n: number): void {
    const line = this.lines[this.row];
    if (!line) return;
    const end = Math.min(line.chars.length, this.col + n);
    for (let c = this.col; c < end; c++) {
      line.chars[c] = " ";
      line.attrs[c] = 0;
    }
    this.touch(this.row);
  }

  private deleteChars(n: number): void {
    const line = this.lines[this.row];
    if (!line) return;
    line.chars.splice(this.col, n);
    line.attrs.splice(this.col, n);
    this.touch(this.row);
  }

  private insertChars(n: number): void {
    const line = this.lines[this.row];
    if (!line || line.chars.length <= this.col) return;
    const blanks = Math.min(n, this.cols);
    line.chars.splice(this.col, 0, ...Array<string>(blanks).fill(" "));
    line.attrs.splice(this.col, 0, ...Array<number>(blanks).fill(0));
    line.chars.length = Math.min(line.chars.length, this.cols);
    line.attrs.length = line.chars.length;
    this.touch(this.row);
  }

  /** Removes `n` lines at `from` and adds as many blank ones at the bottom of the scrolling region. */
  private pullUp(from: number, n: number): void {
    const bottom = this.top + this.regionBottom;
    if (from > bottom) return;
    const count = Math.min(n, bottom - from + 1);
    this.lineAt(bottom);
    this.lines.splice(from, count);
    this.lines.splice(bottom - count + 1, 0, ...this.blankLines(count));
    this.moved(from, bottom);
  }

  /** Adds `n` blank lines at `at`, pushing the lines below down and off the scrolling region. */
  private pushDown(at: number, n: number): void {
    const bottom = this.top + this.regionBottom;
    if (at > bottom) return;
    const count = Math.min(n, bottom - at + 1);
    this.lineAt(bottom);
    this.lines.splice(at, 0, ...this.blankLines(count));
    this.lines.splice(bottom + 1, count);
    this.moved(at, bottom);
  }

  private blankLines(n: number): Line[] {
    return Array.from({ length: n }, () => this.newLine());
  }

  private insideRegion(): boolean {
    return this.row >= this.top + this.regionTop && this.row <= this.top + this.regionBottom;
  }

  private insertLines(n: number): void {
    if (this.insideRegion()) this.pushDown(this.row, n);
    this.col = 0;
  }

  private deleteLines(n: number): void {
    if (this.insideRegion()) this.pullUp(this.row, n);
    this.col = 0;
  }

  private scrollUp(n: number): void {
    this.pullUp(this.top + this.regionTop, n);
  }

  private scrollDown(n: number): void {
    this.pushDown(this.top + this.regionTop, n);
  }

  private saveCursor(): void {
    this.saved = { row: this.row - this.top, col: this.col, attr: this.attr };
  }

  private restoreCursor(): void {
    if (!this.saved) return;
    this.row = this.top + clamp(this.saved.row, 0, this.rows - 1);
    this.col = clamp(this.saved.col, 0, this.cols);
    this.attr = this.saved.attr;
  }

  private enterAlternate(saveCursor: boolean): void {
    if (this.main) return;
    if (saveCursor) this.saveCursor();
    this.main = {
      lines: this.lines,
      top: this.top,
      row: this.row,
      col: this.col,
      base: this.base,
      blockVersions: this.blockVersions,
    };
    const row = this.row - this.top;
    this.lines = [];
    this.top = 0;
    this.row = row;
    this.base = 0;
    this.blockVersions = new Map();
    this.generation++; // other lines altogether: new block keys
  }

  private leaveAlternate(restoreCursor: boolean): void {
    if (!this.main) return;
    ({
      lines: this.lines,
      top: this.top,
      row: this.row,
      col: this.col,
      base: this.base,
      blockVersions: this.blockVersions,
    } = this.main);
    this.main = null;
    this.generation++; // new block keys: all of it is drawn again
    // the window may have changed size meanwhile
    this.top = Math.max(this.top, this.row - this.rows + 1);
    if (restoreCursor) this.restoreCursor();
  }

  private reset(): void {
    if (this.main) this.leaveAlternate(false);
    this.lines = [];
    this.base = 0;
    this.blockVersions = new Map();
    this.generation++;
    this.top = 0;
    this.row = 0;
    this.col = 0;
    this.attr = 0;
    this.saved = null;
    this.regionTop = 0;
    this.regionBottom = this.rows - 1;
    this.cursorVisible = true;
    this.appCursorKeys = false;
    this.bracketedPaste = false;
  }
}

function clamp(n: number, low: number, high: number): number {
  return Math.max(low, Math.min(high, Number.isFinite(n) ? n : low));
}

/** Runs of one line with the same attributes, the cursor's cell a run of its own. */
export function lineRuns(line: Line, cursorCol: number | null): { text: string; attr: number; cursor: boolean }[] {
  const runs: { text: string; attr: number; cursor: boolean }[] = [];
  const length = Math.max(line.chars.length, cursorCol === null ? 0 : cursorCol + 1);
  for (let c = 0; c < length; c++) {
    const ch = line.chars[c] ?? " ";
    const attr = line.attrs[c] ?? 0;
    const cursor = c === cursorCol;
    const last = runs[runs.length - 1];
    if (last && !cursor && !last.cursor && last.attr === attr) last.text += ch;
    else runs.push({ text: ch, attr, cursor });
  }
  return runs;
}

/** How many columns and rows fit in a box, given one character's size (all in pixels). */
export function gridSize(width: number, height: number, charWidth: number, charHeight: number): { cols: number; rows: number } {
  if (!(charWidth > 0) || !(charHeight > 0)) return { cols: DEFAULT_COLS, rows: DEFAULT_ROWS };
  return {
    cols: clamp(Math.floor(width / charWidth), 20, 500),
    rows: clamp(Math.floor(height / charHeight), 5, 200),
  };
}

// -- keys ---------------------------------------------------------------------------------

export interface KeyLike {
  key: string;
  ctrlKey?: boolean;
  altKey?: boolean;
  metaKey?: boolean;
  shiftKey?: boolean;
}

const CURSOR_KEYS: Record<string, string> = {
  ArrowUp: "A",
  ArrowDown: "B",
  ArrowRight: "C",
  ArrowLeft: "D",
  Home: "H",
  End: "F",
};
const TILDE_KEYS: Record<string, number> = {
  Insert: 2,
  Delete: 3,
  PageUp: 5,
  PageDown: 6,
  F5: 15,
  F6: 17,
  F7: 18,
  F8: 19,
  F9: 20,
  F10: 21,
  F11: 23,
  F12: 24,
};
const FUNCTION_KEYS: Record<string, string> = { F1: "P", F2: "Q", F3: "R", F4: "S" };
const CTRL_SYMBOLS: Record<string, string> = {
  "@": "\x00",
  " ": "\x00",
  "2": "\x00",
  "[": "\x1b",
  "\\": "\x1c",
  "]": "\x1d",
  "^": "\x1e",
  "6": "\x1e",
  _: "\x1f",
  "-": "\x1f",
  "/": "\x1f",
  "?": "\x7f",
};

/**
 * What a terminal sends for a key (the KeyboardEvent's `key` and modifiers), or null when the key
 * is not the terminal's: the browser then does what it does (Cmd shortcuts, Ctrl-V paste,
 * Shift+Tab leaving the terminal, Shift+PageUp/PageDown scrolling it).
 */
export function keyInput(event: KeyLike, appCursorKeys = false): string | null {
  const { key } = event;
  const ctrl = !!event.ctrlKey;
  const alt = !!event.altKey;
  const shift = !!event.shiftKey;
  if (event.metaKey) return null;
  const modifier = 1 + (shift ? 1 : 0) + (alt ? 2 : 0) + (ctrl ? 4 : 0);

  const cursor = CURSOR_KEYS[key];
  if (cursor) {
    if (modifier > 1) return `\x1b[1;${modifier}${cursor}`;
    return appCursorKeys ? `\x1bO${cursor}` : `\x1b[${cursor}`;
  }
  const tilde = TILDE_KEYS[key];
  if (tilde !== undefined) {
    if (shift && (key === "PageUp" || key === "PageDown")) return null;
    return modifier > 1 ? `\x1b[${tilde};${modifier}~` : `\x1b[${tilde}~`;
  }
  const fn = FUNCTION_KEYS[key];
  if (fn) return modifier > 1 ? `\x1b[1;${modifier}${fn}` : `\x1bO${fn}`;

  switch (key) {
    case "Enter":
      return alt ? "\x1b\r" : "\r";
    case "Backspace":
      return ctrl ? "\x08" : alt ? "\x1b\x7f" : "\x7f";
    case "Tab":
      return shift ? null : "\t";
    case "Escape":
      return "\x1b";
  }
  if ([...key].length !== 1) return null; // Shift, Dead, Unidentified, Process (IME) and the like

  if (ctrl) {
    const lower = key.toLowerCase();
    if (lower >= "a" && lower <= "z") {
      if (lower === "v" || (shift && lower === "c")) return null; // paste; Ctrl+Shift+C copies
      const control = String.fromCharCode(lower.charCodeAt(0) - 96);
      return alt ? `\x1b${control}` : control;
    }
    const symbol = CTRL_SYMBOLS[key];
    if (symbol && !alt) return symbol;
    // Ctrl+Alt is AltGr on some keyboards: the character it typed
    return alt ? key : null;
  }
  if (alt && key.charCodeAt(0) < 0x80) return `\x1b${key}`; // Meta as an ESC prefix
  return key;
}

/** A paste as the terminal sends it: line breaks as Enter (CR), bracketed when the shell asked. */
export function pasteInput(text: string, bracketed: boolean): string {
  const normalized = text.replace(/\r\n?|\n/g, "\r");
  if (!bracketed) return normalized;
  return `\x1b[200~${normalized.replaceAll("\x1b[201~", "")}\x1b[201~`;
}

/** Splits input into pieces of at most `max` characters, never between the halves of a surrogate pair. */
export function chunkInput(data: string, max = 65536): string[] {
  const chunks: string[] = [];
  let start = 0;
  while (start < data.length) {
    let end = Math.min(data.length, start + max);
    if (end < data.length && end - start > 1) {
      const code = data.charCodeAt(end - 1);
      if (code >= 0xd800 && code <= 0xdbff) end--;
    }
    chunks.push(data.slice(start, end));
    start = end;
  }
  return chunks;
}
