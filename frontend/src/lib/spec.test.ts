import { describe, expect, it } from "vitest";
import { parse } from "yaml";

import { afterText, applyHint, durationText, checkForm, emptyForm, errorsFor, formToSpec, parseSpecYaml, specToForm, specToYaml, unplacedErrors, withoutEdited } from "./spec";

describe("form and spec", () => {
  it("leaves defaults out of the spec", () => {
    const form = { ...emptyForm(), name: "a", vc: "vision", flavor: "s-A100", command: "python t.py" };
    expect(formToSpec(form)).toEqual({ name: "a", vc: "vision", flavor: "s-A100", command: "python t.py" });
  });

  it("round-trips every field through YAML", () => {
    const form = {
      ...emptyForm(),
      name: "resnet",
      vc: "vision",
      flavor: "m-A100",
      image: "pytorch:24",
      commandMode: "args" as const,
      command: "python\ntrain.py",
      env: [{ key: "A", value: "1" }],
      mounts: [{ name: "datasets", path: "/data", read_only: true }],
      replicas: "2",
      priority: "dev",
      retryLimit: "3",
      retryBackoff: "30",
      permanentExitCodes: "2, 3",
      checkpointEnabled: true,
      checkpointSignal: "SIGUSR2",
      checkpointGrace: "60",
      timeLimit: "36h",
      timeSliceable: true,
      after: "41, 42",
      afterType: "notok",
      notify: ["failed", "running"],
    };
    expect(formToSpec(form).after).toEqual([41, 42]);
    expect(formToSpec(form).after_type).toBe("notok");
    expect(formToSpec(form).notify).toEqual(["running", "failed"]); // in the form's order
    const yaml = specToYaml(formToSpec(form));
    const parsed = parseSpecYaml(yaml);
    expect(parsed.ok).toBe(true);
    if (parsed.ok) expect(specToForm(parsed.spec).form).toEqual({ ...form, notify: ["running", "failed"] });
  });

  it("writes YAML the portal reads back as the same text", () => {
    const spec = { name: "j", env: { FLAG: "yes", START: "12:30", RUN_DATE: "2026-01-01", SIZE: "1_000", OFF: "off" } };
    const yaml = specToYaml(spec);
    expect(parse(yaml, { version: "1.1" })).toEqual(spec);
    expect(parseSpecYaml(yaml)).toEqual({ ok: true, spec });
  });

  it("keeps a notify state the form does not offer, for the API to refuse", () => {
    const form = { ...emptyForm(), notify: ["exploded", "succeeded"] };
    expect(formToSpec(form).notify).toEqual(["succeeded", "exploded"]);
  });

  it("keeps keys the form does not show", () => {
    const parsed = parseSpecYaml("name: x\nvc: v\ncommand: c\nresources: {gpus: 2}\nbogus: 1\n");
    expect(parsed.ok).toBe(true);
    if (!parsed.ok) return;
    const { form, extra } = specToForm(parsed.spec);
    expect(extra).toEqual({ resources: { gpus: 2 }, bogus: 1 });
    expect(formToSpec(form, extra)).toMatchObject({ resources: { gpus: 2 }, bogus: 1 });
  });

  it("leaves the default after_type out and keeps one it does not know", () => {
    expect(formToSpec({ ...emptyForm(), after: "41" })).not.toHaveProperty("after_type");
    const parsed = parseSpecYaml("name: x\nvc: v\ncommand: c\nafter: [41]\nafter_type: sometimes\n");
    expect(parsed.ok).toBe(true);
    if (!parsed.ok) return;
    const { form, extra } = specToForm(parsed.spec);
    expect(form.afterType).toBe("sometimes");
    expect(formToSpec(form, extra).after_type).toBe("sometimes");
  });

  it("says what the jobs of after must do", () => {
    // A condition ("Starts once #7 has succeeded"), not a report that #7 succeeded.
    expect(afterText(undefined, 1)).toBe("has succeeded");
    expect(afterText("ok", 2)).toBe("have succeeded");
    expect(afterText("any", 2)).toBe("have ended");
    expect(afterText("notok", 1)).toBe("has ended without succeeding");
    expect(afterText("notok", 2)).toBe("have all ended, one of them without succeeding");
  });

  it("loads a stored spec back as it was written: a shell line, a readable time limit", () => {
    // The portal stores `command: sleep 600` as sh -c and `time_limit: 1h` as 3600.
    const { form } = specToForm({ name: "a", vc: "v", command: ["sh", "-c", "sleep 600"], time_limit: 3600 });
    expect(form.commandMode).toBe("shell");
    expect(form.command).toBe("sleep 600");
    expect(form.timeLimit).toBe("1h");
    expect(formToSpec(form)).toMatchObject({ command: "sleep 600", time_limit: "1h" });
    const list = specToForm({ command: ["python", "train.py"] }).form;
    expect(list.commandMode).toBe("args");
    expect(list.command).toBe("python\ntrain.py");
    expect(specToForm({ command: ["sh", "-c"] }).form.commandMode).toBe("args");
  });

  it("writes seconds as a duration the portal reads back as the same seconds", () => {
    const cases: [number, string][] = [
      [3600, "1h"],
      [5400, "90m"],
      [129600, "1d12h"],
      [86400, "1d"],
      [45, "45s"],
      [3630, "1h30s"],
      [88200, "1d30m"],
    ];
    for (const [seconds, text] of cases) expect(durationText(seconds)).toBe(text);
    expect(specToForm({ time_limit: "36h" }).form.timeLimit).toBe("36h");
  });

  it("places an after_type error under its field", () => {
    expect(unplacedErrors({ after_type: ["No jobs to wait for."] })).toEqual([]);
  });

  it("sends numbers that are not numbers as typed", () => {
    expect(formToSpec({ ...emptyForm(), replicas: "two" }).replicas).toBe("two");
    expect(formToSpec({ ...emptyForm(), replicas: "4" }).replicas).toBe(4);
  });

  it("reports YAML that is not a mapping", () => {
    expect(parseSpecYaml("- a\n- b").ok).toBe(false);
    expect(parseSpecYaml("name: [").ok).toBe(false);
  });

  it("places API errors under their fields", () => {
    const errors = { "retries.limit": ["too big"], replicas: ["bad"], gpus: ["unknown"] };
    expect(errorsFor(errors, "retries")).toEqual(["too big"]);
    expect(errorsFor(errors, "replicas")).toEqual(["bad"]);
    expect(unplacedErrors(errors)).toEqual([["gpus", ["unknown"]]]);
  });

  it("names nested errors in the form's words, never by internal keys", () => {
    const errors = {
      "after.0": ["A valid integer is required."],
      "retries.limit": ["Ensure this value is greater than or equal to 0."],
      "retries.backoff_seconds": ["bad"],
      "mounts.1.path": ["must be absolute"],
    };
    expect(errorsFor(errors, "after")).toEqual(["The first job id: A valid integer is required."]);
    expect(errorsFor(errors, "retries")).toEqual(["Ensure this value is greater than or equal to 0.", "Backoff: bad"]);
    expect(errorsFor(errors, "mounts")).toEqual(["Mount 2 path: must be absolute"]);
    for (const msg of [...errorsFor(errors, "after"), ...errorsFor(errors, "retries")]) {
      expect(msg).not.toMatch(/^(0|limit|backoff_seconds):/);
    }
  });

  it("refuses job ids that are not numbers before sending", () => {
    expect(checkForm({ ...emptyForm(), after: "abc, 99999" })).toEqual({
      after: ['"abc" is not a job id: give job numbers, such as 41, 42.'],
    });
    expect(checkForm({ ...emptyForm(), after: "41, 42" })).toEqual({});
    expect(checkForm({ ...emptyForm(), retryLimit: "-5" }).retries).toHaveLength(1);
  });

  it("drops the messages of the fields an edit changed", () => {
    const errors = { after: ["x"], "retries.limit": ["y"], name: ["z"] };
    expect(withoutEdited(errors, { retryLimit: "1" })).toEqual({ after: ["x"], name: ["z"] });
    expect(withoutEdited(errors, { name: "n" })).toEqual({ after: ["x"], "retries.limit": ["y"] });
  });
});

describe("applying a what-if hint", () => {
  const spec = { name: "big", vc: "vision", flavor: "l-A100", command: "python t.py", replicas: 2, env: { A: "1" } };

  it("takes the hint's flavor and replicas and keeps the rest", () => {
    const next = applyHint(spec, { replicas: 1, gpus_per_replica: 8, gpu_model: "V100", flavor: "l-V100" });
    expect(next).toEqual({ name: "big", vc: "vision", flavor: "l-V100", command: "python t.py", env: { A: "1" } });
    expect(spec.flavor).toBe("l-A100");
  });

  it("drops a time limit the new flavor does not allow", () => {
    const long = { ...spec, time_limit: 604800 };
    const hint = { replicas: 2, gpus_per_replica: 2, gpu_model: "A100", flavor: "s-A100" };
    expect(applyHint(long, hint, 72 * 3600).time_limit).toBeUndefined();
    expect(applyHint({ ...spec, time_limit: 3600 }, hint, 72 * 3600).time_limit).toBe(3600);
  });

  it("scales explicit resources when no flavor has the shape", () => {
    const given = { name: "r", vc: "vision", command: "x", resources: { gpus: 8, gpu_model: "A100", cpu: 64, memory_gb: 512 } };
    const next = applyHint(given, { replicas: 2, gpus_per_replica: 4, gpu_model: "A100", flavor: null, time_limit_s: 7200 });
    expect(next.resources).toEqual({ gpus: 4, gpu_model: "A100", cpu: 32, memory_gb: 256 });
    expect(next.replicas).toBe(2);
    expect(next.time_limit).toBe(7200);
  });
});
