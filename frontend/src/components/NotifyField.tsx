import { fetchAll } from "../api/client";
import type { Webhook } from "../api/types";
import { useResource } from "../lib/useResource";
import { notifyChannels } from "../lib/webhooks";
import { useSession } from "../session";

interface NotifyFieldProps {
  states: readonly string[];
  chosen: string[];
  onChange: (chosen: string[]) => void;
  errors: string[];
}

/** The spec's `notify`: the states to be told about, by mail and to the user's enabled webhooks;
 * offered only when one of them would reach the user, with a hint that says where it goes. */
export function NotifyField({ states, chosen, onChange, errors }: NotifyFieldProps) {
  const { me } = useSession();
  const hooks = useResource((signal) => fetchAll<Webhook>("/api/v1/webhooks/", signal), "webhooks");
  const channels = notifyChannels(me, hooks.data?.filter((h) => h.enabled).length ?? 0);
  return (
    <div className={errors.length ? "field has-error" : "field"}>
      <fieldset className="choices">
        <legend>Notify me when it is</legend>
        {states.map((state) => (
          <label key={state} className="checkbox">
            <input
              type="checkbox"
              disabled={!channels.possible}
              checked={chosen.includes(state)}
              onChange={(e) => onChange(e.target.checked ? [...chosen, state] : chosen.filter((s) => s !== state))}
            />{" "}
            {state}
          </label>
        ))}
      </fieldset>
      <p className="hint">{channels.hint}</p>
      {errors.map((msg) => (
        <p key={msg} className="field-error">
          {msg}
        </p>
      ))}
    </div>
  );
}
