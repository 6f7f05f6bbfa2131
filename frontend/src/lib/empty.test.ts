import { describe, expect, it } from "vitest";

import { emptyOutputText, emptyTelemetryText } from "./empty";
import { pluralize } from "./format";

describe("what the job page says when it has nothing to show", () => {
  it("tells a job that never ran from one that has not started", () => {
    expect(emptyOutputText(null, true, false)).toBe("The job never ran.");
    expect(emptyOutputText(null, false, false)).toBe("The job has not started yet.");
    expect(emptyOutputText(1, true, false)).toBe("The job printed nothing.");
    expect(emptyOutputText(1, false, false)).toBe("No output yet.");
    expect(emptyOutputText(1, false, true)).toBe("No line matches.");
  });

  it("says no telemetry was recorded for an ended job", () => {
    expect(emptyTelemetryText(1, true)).toBe("No telemetry was recorded.");
    expect(emptyTelemetryText(null, true)).toBe("The job never ran.");
    expect(emptyTelemetryText(1, false)).toBe("No samples yet.");
  });

  it("counts one line as a line", () => {
    expect(pluralize(1, "line")).toBe("1 line");
    expect(pluralize(2, "line")).toBe("2 lines");
  });
});
