import { describe, expect, it } from "vitest";
import { parse } from "yaml";

import { arrayBody, arrayErrors, arrayYaml, copiesHint, idRanges, isArray, parseCopies } from "./array";

describe("the Copies field", () => {
  it("sends a whole number as a number and anything else as typed", () => {
    expect(parseCopies(" 8 ")).toBe(8);
    expect(parseCopies("1")).toBe(1);
    expect(parseCopies("0")).toBe(0);
    expect(parseCopies("2.5")).toBe("2.5");
    expect(parseCopies("")).toBe("");
  });

  it("asks for an array for anything but 1", () => {
    expect(isArray(1)).toBe(false);
    expect(isArray(3)).toBe(true);
    // The API says what is wrong with these, under the field.
    expect(isArray(0)).toBe(true);
    expect(isArray("")).toBe(true);
  });

  it("says what each copy gets", () => {
    expect(copiesHint(3)).toBe("Each copy gets ARRAY_INDEX 0 to 2 in its environment and a name ending -0 to -2. Check tries one copy.");
    expect(copiesHint(1)).toMatch(/^1 to 1000\. .*ARRAY_INDEX 0 to N-1.* Check tries one copy\.$/);
    expect(copiesHint(5000)).toMatch(/^1 to 1000\./);
  });
});

describe("array requests", () => {
  it("puts the form's spec under job", () => {
    expect(arrayBody({ name: "sweep", vc: "vision" }, 3)).toEqual({ job: { name: "sweep", vc: "vision" }, array: 3 });
  });

  it("sends the YAML spec as typed, indented under job", () => {
    const source = "# sweep\nname: sweep\nlr: 1.5e3\ncommand: |\n  python a.py\n\n  python b.py\n";
    expect(arrayYaml(source, 3)).toBe("array: 3\njob:\n  name: sweep\n  lr: 1.5e3\n  command: |\n    python a.py\n  \n    python b.py\n");
  });

  it("reads back as the same spec, whatever the document looks like", () => {
    const sources = [
      "name: sweep\nvc: vision\nenv:\n  A: '1'\n",
      "---\nname: sweep\nmounts:\n- name: data\n  path: /data\n...\n",
      "%YAML 1.2\n---\nname: sweep\n",
      "--- {name: sweep, command: [python, train.py]}\n",
      "name: sweep\ncommand: >-\n  python train.py\n  --epochs 3\n# the end\n",
      "name: sweep",
    ];
    for (const source of sources) {
      const body = parse(arrayYaml(source, 4)) as { job: unknown; array: unknown };
      expect(body.job).toEqual(parse(source));
      expect(body.array).toBe(4);
    }
  });

  it("quotes a count that is not a number, for the API to refuse", () => {
    expect(parse(arrayYaml("name: sweep\n", "")).array).toBe("");
    expect(parse(arrayYaml("name: sweep\n", "2.5")).array).toBe("2.5");
  });
});

describe("array errors", () => {
  it("names the spec's fields as for one job", () => {
    expect(
      arrayErrors({
        "job.flavor": ["No flavor named no-such."],
        "job.retries.limit": ["too big"],
        job: ["Expected a dictionary of items but got type \"str\"."],
        detail: ["bad"],
        array: ["Ensure this value is less than or equal to 1000."],
      }),
    ).toEqual({
      flavor: ["No flavor named no-such."],
      "retries.limit": ["too big"],
      detail: ["Expected a dictionary of items but got type \"str\".", "bad"],
      array: ["Ensure this value is less than or equal to 1000."],
    });
  });
});

describe("id ranges", () => {
  it("joins consecutive ids", () => {
    expect(idRanges([41, 42, 43])).toBe("41–43");
    expect(idRanges([41, 42, 43, 47, 49, 50])).toBe("41–43, 47, 49–50");
    expect(idRanges([7])).toBe("7");
    expect(idRanges([])).toBe("");
  });
});
