import { type ClipboardEvent, type KeyboardEvent, type Ref, memo, useCallback, useImperativeHandle, useLayoutEffect, useRef } from "react";

import { BOLD, FG_MASK, INVERSE, type Line, type Screen, UNDERLINE, gridSize, keyInput, lineRuns, pasteInput } from "../lib/terminal";

export interface TerminalHandle {
  focus: () => void;
}

/**
 * Shows a terminal screen (lib/terminal.ts) as a monospace block with a cursor and, while focused,
 * sends what is typed or pasted as a terminal would (`onInput`). Works out how many columns and
 * rows fit and reports them (`onResize`) when mounted and whenever its size changes.
 * `version` changes whenever the screen did.
 *
 * Drawing is incremental: the lines are drawn in blocks (`Screen.blocks`), each memoized by its
 * version, and each line memoized by its `rev`, so a redraw costs one comparison per block plus the
 * lines that changed, not the whole scrollback. The caller batches output into at most one
 * redraw per animation frame (see ShellPanel).
 */
export function Terminal({
  screen,
  version,
  label,
  active,
  onInput,
  onResize,
  handle,
}: {
  screen: Screen;
  version: number;
  label: string;
  /** Whether keys go anywhere (the shell is open); the cursor shows only then. */
  active: boolean;
  onInput: (data: string) => void;
  onResize: (cols: number, rows: number) => void;
  handle?: Ref<TerminalHandle>;
}) {
  const box = useRef<HTMLDivElement>(null);
  const probe = useRef<HTMLSpanElement>(null);
  const stick = useRef(true); // follow the output while scrolled to the bottom
  const size = useRef("");
  const onResizeRef = useRef(onResize);
  onResizeRef.current = onResize;

  useImperativeHandle(handle, () => ({ focus: () => box.current?.focus() }), []);

  const measure = useCallback(() => {
    const element = box.current;
    const char = probe.current?.getBoundingClientRect();
    if (!element || !char) return;
    const style = window.getComputedStyle(element);
    const px = (value: string) => Number.parseFloat(value) || 0;
    const width = element.clientWidth - px(style.paddingLeft) - px(style.paddingRight);
    const height = element.clientHeight - px(style.paddingTop) - px(style.paddingBottom);
    const { cols, rows } = gridSize(width, height, char.width / 10, char.height);
    const key = `${cols}x${rows}`;
    if (key === size.current) return;
    size.current = key;
    onResizeRef.current(cols, rows);
  }, []);

  useLayoutEffect(() => {
    measure();
    const element = box.current;
    if (typeof ResizeObserver !== "undefined" && element) {
      const observer = new ResizeObserver(() => measure());
      observer.observe(element);
      return () => observer.disconnect();
    }
    window.addEventListener("resize", measure);
    return () => window.removeEventListener("resize", measure);
  }, [measure]);

  useLayoutEffect(() => {
    const element = box.current;
    if (element && stick.current) element.scrollTop = element.scrollHeight;
  }, [version]);

  const onScroll = () => {
    const element = box.current;
    if (element) stick.current = element.scrollTop + element.clientHeight >= element.scrollHeight - 4;
  };

  const send = (data: string) => {
    stick.current = true;
    onInput(data);
  };

  const onKeyDown = (event: KeyboardEvent<HTMLDivElement>) => {
    if (!active || event.nativeEvent.isComposing) return;
    const { key, ctrlKey, shiftKey } = event;
    // Ctrl+C with text selected in the terminal copies it rather than interrupting
    if (ctrlKey && key.toLowerCase() === "c" && hasSelectionIn(box.current)) return;
    if (shiftKey && (key === "PageUp" || key === "PageDown")) {
      const element = box.current;
      if (element) element.scrollTop += (key === "PageUp" ? -1 : 1) * element.clientHeight * 0.9;
      event.preventDefault();
      return;
    }
    const data = keyInput(event, screen.appCursorKeys);
    if (data === null) return;
    event.preventDefault();
    send(data);
  };

  const onPaste = (event: ClipboardEvent<HTMLDivElement>) => {
    if (!active) return;
    event.preventDefault();
    const text = event.clipboardData.getData("text/plain");
    if (text) send(pasteInput(text, screen.bracketedPaste));
  };

  const view = screen.blocks();
  const cursorLine = active && screen.cursorVisible ? view.cursorLine : null;
  return (
    <div
      ref={box}
      className={active ? "terminal" : "terminal inactive"}
      tabIndex={0}
      role="application"
      aria-roledescription="terminal"
      aria-label={label}
      onKeyDown={onKeyDown}
      onPaste={onPaste}
      onScroll={onScroll}
      data-version={version}
      data-testid="terminal"
    >
      <span ref={probe} className="terminal-probe" aria-hidden="true">
        MMMMMMMMMM
      </span>
      {view.blocks.map((block) => {
        const hasCursor = cursorLine !== null && cursorLine >= block.start && cursorLine < block.start + block.count;
        return (
          <TerminalBlock
            key={block.key}
            screen={screen}
            start={block.start}
            count={block.count}
            version={block.version}
            cursorLine={hasCursor ? cursorLine : null}
            cursorCol={hasCursor ? view.cursorCol : null}
          />
        );
      })}
    </div>
  );
}

/**
 * A block of lines; drawn again only when its version or the cursor in it changes. The browser
 * skips laying out and painting the blocks out of view (content-visibility), so long scrollback
 * costs nothing while output goes on; until laid out, a block is as high as its lines
 * (1.3em each, as .terminal-line in styles.css). Its text stays selectable and searchable.
 */
const TerminalBlock = memo(function TerminalBlock({
  screen,
  start,
  count,
  cursorLine,
  cursorCol,
}: {
  screen: Screen;
  start: number;
  count: number;
  version: number;
  cursorLine: number | null;
  cursorCol: number | null;
}) {
  return (
    <div className="terminal-block" style={{ contentVisibility: "auto", containIntrinsicSize: `auto ${count * 1.3}em` }}>
      {screen.linesAt(start, count).map((line, index) => (
        <TerminalLine key={line.id} line={line} rev={line.rev} cursor={start + index === cursorLine ? cursorCol : null} />
      ))}
    </div>
  );
});

const TerminalLine = memo(function TerminalLine({ line, cursor }: { line: Line; rev: number; cursor: number | null }) {
  return (
    <div className="terminal-line">
      {lineRuns(line, cursor).map((run, index) => {
        const className = runClass(run.attr, run.cursor);
        return className ? (
          <span key={index} className={className}>
            {run.text}
          </span>
        ) : (
          run.text
        );
      })}
    </div>
  );
});

function runClass(attr: number, cursor: boolean): string {
  const names: string[] = [];
  const fg = attr & FG_MASK;
  if (fg) names.push(`t-fg${fg - 1}`);
  if (attr & BOLD) names.push("t-bold");
  if (attr & UNDERLINE) names.push("t-underline");
  if (attr & INVERSE) names.push("t-inverse");
  if (cursor) names.push("terminal-cursor");
  return names.join(" ");
}

function hasSelectionIn(element: HTMLElement | null): boolean {
  const selection = window.getSelection();
  if (!element || !selection || selection.isCollapsed || !selection.toString()) return false;
  return element.contains(selection.anchorNode) || element.contains(selection.focusNode);
}
