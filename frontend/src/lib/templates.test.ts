import { describe, expect, it } from "vitest";

import { sortTemplates, splitTemplateErrors, templateLabel } from "./templates";

const mine = { id: 1, name: "train", owner: "alice", shared: false, description: "" };
const shared = { id: 2, name: "eval", owner: "bob", shared: true, description: "Nightly eval" };

describe("templateLabel", () => {
  it("names your own by name, another's shared one with its owner", () => {
    expect(templateLabel(mine, "alice")).toBe("train");
    expect(templateLabel(shared, "alice")).toBe("eval (shared by bob): Nightly eval");
    expect(templateLabel(shared, "bob")).toBe("eval: Nightly eval");
  });
});

describe("sortTemplates", () => {
  it("puts your own first, then by name", () => {
    const other = { ...shared, id: 3, name: "a-first" };
    expect(sortTemplates([shared, other, mine], "alice").map((t) => t.id)).toEqual([1, 3, 2]);
  });
});

describe("splitTemplateErrors", () => {
  it("gives spec errors to the form under a submission's keys, the rest to the dialog", () => {
    const split = splitTemplateErrors({
      "spec.vc": ["No virtual cluster named 'x' that you can submit to."],
      "spec.retries.limit": ["Too many."],
      spec: ["Expected a dictionary."],
      name: ["You already have a template named 'train'."],
    });
    expect(split.spec).toEqual({
      vc: ["No virtual cluster named 'x' that you can submit to."],
      "retries.limit": ["Too many."],
      detail: ["Expected a dictionary."],
    });
    expect(split.own).toEqual({ name: ["You already have a template named 'train'."] });
  });
});
